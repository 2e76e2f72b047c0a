#!/usr/bin/env bash
# The device checks, one command for a session lent a GPU node (one H200 with 16 cores: about 6 minutes;
# each step has its own timeout, so a slow one does not eat the next). Set up first (gpu_setup.sh):
#   . tools/measure/gpu_setup.sh .whl && OUT=/path/to/out bash tools/measure/gpu_check.sh
# 1. the CUDA tests: the batch resize and the batch part give on the GPU the pixels the CPU gives
#    (tests/test_resize.py, tests/test_decode_workers.py), pinned batches, side-stream copies, the CUDA
#    RNG in a checkpoint and NCCL over MPI (tests/test_train_cuda.py), and torchvision's resize
#    (tests/test_torchvision_resize.py, torch's float path on the GPU);
# 2. the recipe's two resize filters against torchvision v2's own functions, on the CPU and on the GPU
#    (python -m dstore.tools.measure.resize_fidelity; torchvision imports there, not beside the CPU torch);
# 3. the loader alone (python -m dstore.tools.measure.loader): 14 decode workers with the resize in the
#    workers and on the GPU against simplejpeg alone on as many cores, batch 256, 224x224, batches copied
#    to the GPU, and resnet50 alone under bf16 and channels-last;
# 4. `dstore train` of resnet50 (bf16, channels-last) fed by the store (14 workers, resize on the GPU),
#    its samples/s and data wait per epoch.
# Everything it prints is also under $OUT (default ./gpu-check): summary.txt, *.md tables, *.json, logs.
set -u
OUT=${OUT:-gpu-check}
COUNT=${COUNT:-2048}
# the compiled per-sample kernels (dstore.codec.kernels) load after 200 large samples per process, not
# 2,000: the loader's rows wait for them (measure.loader's warm-up) and the runs are short
export DSTORE_NATIVE_AFTER=${DSTORE_NATIVE_AFTER:-200}
mkdir -p "$OUT"
log() { echo "== $* ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT/summary.txt"; }

log "device"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$OUT/summary.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/summary.txt"

log "1. CUDA tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_train_cuda.py tests/test_torchvision_resize.py \
    "tests/test_resize.py::test_the_batch_resize_is_the_same_on_a_gpu" \
    "tests/test_decode_workers.py::test_the_batch_part_gives_the_same_pixels_on_a_gpu" > "$OUT/tests.log" 2>&1
tail -15 "$OUT/tests.log" | tee -a "$OUT/summary.txt"

log "2. the resize filters against torchvision v2's own functions (CPU and CUDA)"
python3 -c "import torchvision; print('torchvision', torchvision.__version__)" 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
python3 -c "import sys; sys.path.insert(0, 'tests'); from support.photos import write_folder; write_folder('/tmp/pf', 54)" \
    && timeout 30 dstore ingest /tmp/pf /tmp/photos54.h5 --overwrite > /dev/null 2>&1 \
    && OMP_NUM_THREADS=1 timeout 90 python3 -m dstore.tools.measure.resize_fidelity /tmp/photos54.h5 --size 224 \
        --count 54 --rounds 2 2>&1 | tee "$OUT/fidelity.md" | tee -a "$OUT/summary.txt"

log "data: $COUNT synthetic ImageNet-like JPEGs"
timeout 120 dstore ingest synthetic "/tmp/syn.h5" --count "$COUNT" --overwrite 2>&1 | tail -1 | tee -a "$OUT/summary.txt"

log "3. loader alone vs decoder alone"
timeout 120 python3 -m dstore.tools.measure.loader /tmp/syn.h5 --threads 14 --workers 14 \
    --resize-on worker device --batch-size 256 --size 224 --device cuda --epochs 1 --no-gil \
    --model resnet50 --amp bf16 --channels-last --out "$OUT/loader.json" --md "$OUT/loader.md" > "$OUT/loader.log" 2>&1
cat "$OUT/loader.md" 2>/dev/null | tee -a "$OUT/summary.txt" || tail -5 "$OUT/loader.log" | tee -a "$OUT/summary.txt"

log "4. dstore train resnet50 bf16 channels-last, 14 workers, resize on the GPU"
timeout 150 dstore train /tmp/syn.h5 --device cuda --model resnet50 --amp bf16 --channels-last \
    --image-size 224 --batch-size 256 --decode-workers 14 --resize-on device --epochs 3 \
    --run-dir /tmp/run-device --overwrite > "$OUT/train.log" 2>&1
grep -E "^epoch|test accuracy|Error|error" "$OUT/train.log" | tee -a "$OUT/summary.txt"
log "done"
