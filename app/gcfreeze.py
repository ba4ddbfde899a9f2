"""Keep the cyclic garbage collector's full collections short in a serving process.

A web process holds hundreds of thousands of long-lived objects (about 310,000 in the
load test of docs/respondents.md: torch, SQLAlchemy, the app, the fitted models) that
never become garbage. CPython's full (generation 2) collection
traverses every tracked object, so in a worker serving ~100 answers/s one such collection
stalls the whole process for ~0.3 s, and every request in flight waits for it: measured
in the load test (docs/respondents.md), four full collections a minute per worker made
the p99 of the answer call. ``gc.freeze()`` moves every object tracked at that moment
into a permanent generation that collections skip; objects created later (per request)
are collected as before. Frozen objects are still freed by reference counting when the
last reference goes (an evicted model); only a reference cycle among frozen objects
would stay until the process ends, and the ``gc.collect()`` before each freeze leaves
no cyclic garbage behind.

Called after start-up imports (the lifespan) and after a model is deserialised into the
per-process cache (its tensors and Python objects live as long as the process).
``PRIORLY_GC_FREEZE=0`` (:attr:`app.settings.Settings.gc_freeze`) turns it off.
"""

from __future__ import annotations

import gc
import threading

from app.settings import get_settings

_LOCK = threading.Lock()


def enabled() -> bool:
    """Whether freezing is on (the process settings, read when first asked)."""
    return get_settings().gc_freeze


def freeze_long_lived() -> int:
    """Collect once, then freeze every tracked object; returns the permanent count."""
    if not enabled():
        return gc.get_freeze_count()
    with _LOCK:
        gc.collect()
        gc.freeze()
        return gc.get_freeze_count()
