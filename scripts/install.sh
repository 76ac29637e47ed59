#!/usr/bin/env bash
# Create the virtualenv and install Dyno's dependencies.
# CPU machines get the pinned CPU build of torch (an unpinned torch pulls a multi-GB CUDA build);
# GPU hosts (nvidia-smi present) keep the CUDA torch they install themselves.
set -euo pipefail
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
if ! command -v "$PYTHON" >/dev/null; then
  echo "error: $PYTHON not found. Install Python 3.11 or run: make PYTHON=python3 ..." >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
if ! command -v nvidia-smi >/dev/null 2>&1 && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  $PIP install "torch==2.13.0"
fi
# Pinned: every dependency at the version requirements.lock names (`make lock` refreshes it), then
# Dyno itself without re-resolving. GPU hosts keep the triton that came with their CUDA torch.
if command -v nvidia-smi >/dev/null 2>&1; then
  grep -v '^triton==' requirements.lock > "$VENV/requirements-gpu.lock"
  $PIP install -r "$VENV/requirements-gpu.lock"
else
  $PIP install -r requirements.lock
fi
$PIP install --no-deps -e .
# Runner hosts sandbox candidate code under bubblewrap (runners/sandbox/bwrap.py).
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null || echo "warning: could not install bubblewrap; sandboxed results will not bill" >&2
  else
    echo "warning: bubblewrap (bwrap) is not installed; install it (apt-get install bubblewrap) or sandboxed results will not bill" >&2
  fi
fi
echo "installed into $VENV"
