"""Check that every relative link in the Markdown documents points at a file that exists.

Usage: ``python scripts/check_doc_links.py [FILE.md ...]`` (default: ``README.md``,
``CONTRIBUTING.md``, ``CHANGELOG.md`` and ``docs/**/*.md`` where present). Prints each
broken link as ``file:line: target`` and exits with 1 when there is one, else 0.

A link is ``[text](target)`` or ``![alt](target)``; ``http(s):`` and ``mailto:`` targets
are skipped. Targets are resolved against the linking file's folder; a ``#fragment`` must
name a heading of the Markdown file it points at (GitHub's anchors: lower case,
punctuation dropped, spaces as hyphens). Fenced code blocks are skipped.

Citations count too: a code span that names a repository path (`` `models/persona.py` ``,
`` `docs/group/ces_10.json` ``, `` `tests/gnn/test_train.py::test_x` ``; first part one of
:data:`TOP`) must exist, resolved against the repository root.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SKIP = ("http://", "https://", "mailto:")
TOP = (
    "app",
    "docs",
    "datasets",
    "elicitation",
    "gnn",
    "inference_server",
    "models",
    "scripts",
    "templates",
    "tests",
    ".ci",
)
CITE = re.compile(r"`((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./-]*)(?:::[\w\[\]-]+)?`")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file (duplicates get ``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every relative link in ``path`` whose target does not exist."""
    out: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(line):
            if target.startswith(SKIP):
                continue
            rel, _, frag = target.partition("#")
            rel = rel.split("?", 1)[0]
            dest = path.parent / rel if rel else path
            if not dest.exists():
                out.append((n, target))
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                out.append((n, target))
        for cited in CITE.findall(line):
            if not (ROOT / cited.rstrip("/")).exists():
                out.append((n, cited))
    return out


def main(argv: list[str]) -> int:
    if argv:
        files = [Path(a) for a in argv]
    else:
        files = [ROOT / f for f in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
        files = [f for f in files if f.exists()] + sorted((ROOT / "docs").rglob("*.md"))
    bad = 0
    for f in files:
        for line, target in broken_links(f):
            print(f"{f.relative_to(ROOT) if f.is_absolute() else f}:{line}: {target}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
