#!/usr/bin/env bash
# The GPU checks of one short device session, in order of importance; each step has its own time limit
# so a slow one cannot eat the rest. Logs go to $OUT (default gpu_logs/).
#   bash bench/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
step() {  # step SECONDS NAME COMMAND...: run, log to $OUT/NAME.log, keep going on failure
    local limit=$1 name=$2; shift 2
    echo "== $name" | tee -a "$OUT/summary.log"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "   exit $? after ${SECONDS}s" | tee -a "$OUT/summary.log"
    tail -n 15 "$OUT/$name.log"
}
nvidia-smi -L | tee "$OUT/summary.log"
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/summary.log"
# the whole suite with device 'auto' = CUDA: every model path on the GPU, and the CPU-vs-GPU agreement test
step 200 tests python -m pytest -q -p no:cacheprovider --maxfail=15
step 100 scale python bench/scale.py --device cuda --iterations 100 --no-speedup
step 90 core_speed python bench/core_speed.py --iterations 300 --impute-rows 5400
step 150 subsampled python bench/subsampled_missing_term.py --device cuda --iterations 3000
