#!/usr/bin/env bash
# Creates the separate virtual environment in which `dstore bench` runs its Mosaic Streaming
# baseline (tools/bench/mosaic_peer.py). mosaicml-streaming pulls torchvision, cloud SDKs and, with
# an unpinned torch, a multi-GB CUDA build: that is why it never enters the project's own venv,
# its default install or CI. The bench finds this venv by path and skips Mosaic with a note when
# it is absent.
#
# Usage: bash tools/setup_mosaic.sh [VENV_DIR]      (default: .cache/venv-mosaic, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${DSTORE_MOSAIC_VENV:-.cache/venv-mosaic}}"
PY="${PYTHON:-python3}"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# mosaicml-streaming requires torchvision, which brings the torch build it was made for (on Linux
# x86-64 a CUDA build with its nvidia-* wheels: about 6 GB here). Nothing of it is used on the GPU.
"$VENV/bin/python" -m pip install -q "mosaicml-streaming" numpy
"$VENV/bin/python" -c "import streaming, torch; print('mosaic venv ready:', streaming.__version__, 'torch', torch.__version__)"
echo "$VENV"
