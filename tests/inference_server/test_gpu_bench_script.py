"""``scripts/gpu-persona-bench`` refuses what it cannot do before it installs anything.

Its full run needs a GPU; its ``--dry-run`` (the same steps on a CPU, a few minutes) is
run by hand (docs/inference.md).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-persona-bench"


def run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_unknown_argument(tmp_path: Path) -> None:
    proc = run("--gpus", "2", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "unknown argument --gpus" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so(tmp_path: Path) -> None:
    proc = run(tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "nvidia-smi not found" in proc.stderr and "--dry-run" in proc.stderr
    assert not (tmp_path / "out").exists()
