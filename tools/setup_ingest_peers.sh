#!/usr/bin/env bash
# Creates the virtual environment in which `python -m dstore.tools.measure.ingest` runs the peers'
# writers (tools/measure/ingest_peer.py): LitData `optimize`, Mosaic Streaming `MDSWriter`,
# webdataset `ShardWriter`, Hugging Face `datasets`. It is made with --system-site-packages from an
# interpreter that already has a CPU torch (and, if present, webdataset and datasets), because
# litdata and mosaicml-streaming require torchvision, whose resolution brings a multi-GB CUDA torch.
# So both go in with --no-deps, plus only what they import. torchvision stays out: the wheels on the
# registry are CUDA builds that do not load beside a CPU torch; the peer script then imports Mosaic's
# writer modules alone (they do not use it) and says so in the version it reports.
#
# Usage: bash tools/setup_ingest_peers.sh [VENV_DIR] [BASE_PYTHON]
#        (default: .cache/venv-peers, git-ignored; BASE_PYTHON: $PYTHON or python3)
# Then: DSTORE_PEERS_PYTHON=VENV_DIR/bin/python python -m dstore.tools.measure.ingest ...
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.cache/venv-peers}"
BASE="${2:-${PYTHON:-python3}}"
"$BASE" -m venv --system-site-packages "$VENV"
PY="$VENV/bin/python"
before="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
"$PY" -m pip install -q webdataset datasets
"$PY" -m pip install -q --no-deps "litdata==0.2.76" "mosaicml-streaming==0.13.0" "transformers>=5" tokenizers safetensors
"$PY" -m pip install -q lightning-utilities tifffile obstore zstd brotli catalogue python-snappy xxhash filelock boto3
after="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
if [ "$before" != "$after" ]; then
    echo "setup_ingest_peers: torch changed from $before to $after in $VENV" >&2
    exit 1
fi
"$PY" tools/measure/ingest_peer.py --check
echo "$PY"
