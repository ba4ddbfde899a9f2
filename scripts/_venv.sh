# Shared by scripts/serve and scripts/test (sourced, not run): create .venv if missing and
# install the project into it. Usage: ensure_venv "" | ensure_venv "[dev]"
#
# torch is installed first and pinned (torch==2.13.0): a bare `torch` requirement would
# pull a multi-GB CUDA build. Wheels come from /opt/wheels when that folder exists, else
# from the package index pip is configured with; set $PRIORLY_TORCH_INDEX_URL to the CPU
# wheel index of your choice if that index would give a CUDA build.
# Re-runs are fast: the install is skipped while pyproject.toml and the extras are unchanged.

ensure_venv() {
    local extras="$1"
    local root; root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local venv="$root/.venv"
    if [ ! -x "$venv/bin/python" ]; then
        local py="${PYTHON:-}"
        if [ -z "$py" ]; then
            if command -v python3.11 >/dev/null 2>&1; then py=python3.11; else py=python3; fi
        fi
        if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
            echo "priorly needs Python >= 3.11 ($py is $("$py" --version 2>&1)); set PYTHON=..." >&2
            return 1
        fi
        echo "creating $venv with $py" >&2
        "$py" -m venv "$venv"
    fi
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    local stamp="$venv/.priorly-installed$extras"
    local want; want="$(cat "$root/pyproject.toml" | python -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    local torch_src=()
    if [ -d /opt/wheels ]; then
        torch_src=(--find-links /opt/wheels)
    else
        if [ -n "${PRIORLY_TORCH_INDEX_URL:-}" ]; then
            torch_src=(--extra-index-url "$PRIORLY_TORCH_INDEX_URL")
        fi
    fi
    echo "[$(date -u +%H:%M:%S)] installing torch==2.13.0 into $venv" >&2
    python -m pip install --quiet "${torch_src[@]}" "torch==2.13.0"
    echo "[$(date -u +%H:%M:%S)] installing priorly$extras" >&2
    python -m pip install --quiet -e "$root$extras"
    echo "[$(date -u +%H:%M:%S)] installed" >&2
    echo "$want" > "$stamp"
}
