#!/usr/bin/env bash
# Creates the separate virtual environment with NVIDIA DALI that `dstore bench --peers` and
# `python -m dstore.tools.measure.loader --dali` compare dstore's loader against (tools/bench/dali.py
# runs tools/bench/dali_peer.py there). DALI is about 1.1 GB of wheels and brings its own CUDA
# libraries: it never enters the project's venv, its default install or CI. Its CPU pipelines run
# without a GPU (device_id=None). The bench finds the venv by path ($DSTORE_DALI_PYTHON names its
# python, or --dali PYTHON) and skips DALI with the reason where it is absent.
#
# Usage: bash tools/setup_dali.sh [VENV_DIR]      (default: .cache/venv-dali, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.cache/venv-dali}"
PY="${PYTHON:-python3}"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q numpy "nvidia-dali-cuda120==2.4.0"
"$VENV/bin/python" -c "import nvidia.dali as d; print('DALI venv ready:', d.__version__)"
echo "$VENV/bin/python"
