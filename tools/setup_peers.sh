#!/usr/bin/env bash
# Installs the peers of `dstore bench --peers` (WebDataset, LitData) into the ACTIVE venv without
# letting either change torch: litdata 0.2.76 requires torchvision, whose resolution brings a CUDA
# torch build (GBs) in place of the pinned CPU torch==2.13.0. So litdata goes in with --no-deps and
# only the dependencies it imports are added (pyproject's `peers` extra: webdataset and those).
# The bench skips a peer, with the reason, where it does not import.
#
# Usage: . .venv/bin/activate && bash tools/setup_peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
before="$(python -c 'import torch; print(torch.__version__)')"
python -m pip install -q -e ".[peers]"
python -m pip install -q --no-deps "litdata==0.2.76"
after="$(python -c 'import torch; print(torch.__version__)')"
if [ "$before" != "$after" ]; then
    echo "setup_peers: torch changed from $before to $after; reinstall torch==2.13.0" >&2
    exit 1
fi
python -c "import webdataset, litdata; print('peers ready: webdataset', webdataset.__version__, 'litdata', litdata.__version__)"
