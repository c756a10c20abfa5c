#!/usr/bin/env bash
# Issue #28's one prepared command for a GPU machine (python3 + torch, numpy, pandas, pyarrow, pyyaml; no Airflow,
# TensorFlow or fbgemm-gpu). From the repository root:
#   OUT=/some/dir bash bench/gpu_dlrm_device.sh                       # criteo_f15 size on cuda, ~5 min
#   OUT=/tmp/o PY=.venv/bin/python DEVICE=cpu SIZE="--table_scale 512 --train_rows 16384 --test_rows 2048 \
#     --batch_size 2048 --step_iterations 3 --log_every_steps 2" bash bench/gpu_dlrm_device.sh   # its CPU rehearsal
# Writes under $OUT: gpu.txt (the machine), gpu_dlrm.json (bench.gpu_dlrm --variants: rewritten after each phase),
# bench.log, no_copy_ahead.log (the trainer again on the same data with --no-copy_ahead: batches from pageable host
# memory, copied on the compute stream before each step, as until 2026-11-28; the bench's own trainer run is the
# default, pinned batches copied a step ahead on a side stream).
set -u
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-}
WORK=${WORK:-/tmp/gpu_dlrm_work}
: "${OUT:?set OUT to the directory for the figures}"
mkdir -p "$OUT"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  nproc; free -g | head -2; df -h /tmp | tail -1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$PY" -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
  command -v gcc cc || echo "no C compiler on PATH"
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
# shellcheck disable=SC2086  # SIZE is a list of flags
timeout 420 "$PY" -m bench.gpu_dlrm --device "$DEVICE" --variants --work "$WORK" --json "$OUT/gpu_dlrm.json" $SIZE \
  > "$OUT/bench.log" 2>&1
echo "bench.gpu_dlrm exit $?"
grep -v '^\[rank 0\] step ' "$OUT/bench.log" | tail -30
rm -rf "$WORK/run"
batch=$(echo "$SIZE" | sed -n 's/.*--batch_size \([0-9]*\).*/\1/p')
amp=--amp; [ "$DEVICE" = cpu ] && amp=--no-amp
timeout 150 "$PY" -m models.dlrm.train --dataset_dir "$WORK/data" --output_dir "$WORK/run2" --device "$DEVICE" \
  "$amp" --batch_size "${batch:-65536}" --lr 0.25 --epochs 1 --checkpoint_every_steps 0 --checkpoint_every_minutes 0 \
  --log_every_steps 16 --limit_eval_batches 1 --no-copy_ahead > "$OUT/no_copy_ahead.log" 2>&1
echo "trainer --no-copy_ahead exit $?"
tail -20 "$OUT/no_copy_ahead.log"
rm -rf "$WORK"
