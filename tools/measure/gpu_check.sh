#!/usr/bin/env bash
# Issue 18's device checks, one command for a session lent a GPU node (about 8 minutes on one H200
# with 16 cores; each step has its own timeout, so a slow one does not eat the next):
#   OUT=/path/to/out bash tools/measure/gpu_check.sh
# 1. the CUDA tests of the pipeline: the batch resize and the batch part give on the GPU the pixels
#    the CPU gives (tests/test_resize.py, tests/test_decode_workers.py);
# 2. the loader alone (python -m dstore.tools.measure.loader): 14 decode threads, 1 / 4 / 14 decode
#    workers with the resize in the workers and on the GPU, against simplejpeg alone (full decode,
#    and DCT-scaled) on as many cores, batch 256, 224x224, batches copied to the GPU;
# 3. resnet50 under --amp bf16 --channels-last: the model alone on random input (same tool), then
#    `dstore train` fed by the store (14 workers, resize on the GPU, then in the workers), its
#    samples/s and data wait per epoch.
# Everything it prints is also under $OUT (default ./gpu-check): *.md tables, *.json, train logs.
set -u
OUT=${OUT:-gpu-check}
# the compiled per-sample kernels (dstore.codec.kernels) load after 200 large samples per process, not
# 2,000: the loader's rows wait for them (measure.loader's warm-up) and the runs are short
export DSTORE_NATIVE_AFTER=${DSTORE_NATIVE_AFTER:-200}
mkdir -p "$OUT"
log() { echo "== $* ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT/summary.txt"; }

log "device"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/summary.txt"

log "1. CUDA tests"
timeout 180 python -m pytest -q -m "not mpi" tests/test_resize.py tests/test_decode_workers.py -k "gpu" 2>&1 \
    | tail -5 | tee -a "$OUT/summary.txt"

log "data: 4096 synthetic ImageNet-like JPEGs"
[ -f "$OUT/syn4096.h5" ] || timeout 240 dstore ingest synthetic "$OUT/syn4096.h5" --count 4096 2>&1 | tail -2

log "2. loader alone vs decoder alone"
timeout 240 python -m dstore.tools.measure.loader "$OUT/syn4096.h5" --threads 14 --workers 1 4 14 \
    --resize-on worker device --batch-size 256 --size 224 --device cuda --epochs 1 --no-gil \
    --model resnet50 --amp bf16 --channels-last --out "$OUT/loader.json" --md "$OUT/loader.md" > "$OUT/loader.log" 2>&1
cat "$OUT/loader.md" | tee -a "$OUT/summary.txt"

for where in device worker; do
    log "3. dstore train resnet50 bf16 channels-last, 14 workers, resize on $where"
    rm -rf "$OUT/run-$where"
    timeout 200 dstore train "$OUT/syn4096.h5" --device cuda --model resnet50 --amp bf16 --channels-last \
        --image-size 224 --batch-size 256 --decode-workers 14 --resize-on "$where" --epochs 3 \
        --run-dir "$OUT/run-$where" > "$OUT/train-$where.log" 2>&1
    grep -E "^epoch|test accuracy|Error|error" "$OUT/train-$where.log" | tee -a "$OUT/summary.txt"
done
log "done"
