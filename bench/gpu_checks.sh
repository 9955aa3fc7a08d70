#!/usr/bin/env bash
# The GPU checks of one short device session, in order of importance; each step has its own time limit
# so a slow one cannot eat the rest. Logs go to $OUT (default gpu_logs/).
#   bash bench/gpu_checks.sh
# Packages the GPU image lacks (implicit, xlrd) can travel as wheels in .whl/: they are installed first.
set -uo pipefail
OUT=${OUT:-gpu_logs}
RESULTS=$(mktemp -d)  # the runs' folders, packed into one file at the end (the device tool returns 8 files)
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
PY=${PYTHON:-python3}  # the GPU image's python3 holds its PyTorch
if compgen -G ".whl/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/summary.log"
# the whole suite with device 'auto' = CUDA: every model path on the GPU, and the CPU-vs-GPU agreement test;
# fifteen workers share the GPU (pytest-xdist), as the small models leave it mostly idle; -v names each
# failure as it happens, so a run cut off by its limit still says which tests failed
step 200 tests $PY -m pytest -v -p no:cacheprovider --maxfail=15 -n 15 --tb=short -W ignore
grep -E "(FAILED|ERROR) tests/" "$OUT/tests.log" | sort -u | tee -a "$OUT/summary.log"
# the paper's full Yahoo! R3-sized run of one model: 10,000 iterations and the MCAR scoring; then the
# main job's best model, the categorical decoder with the row offset, at the same size
for model in notmiwae-gaussian notmiwae-categorical-activity; do
    step 140 "yahoo_$model" $PY -m mnar_recsys.cli ratings --models "$model" --users 15400 --items 1000 \
        --seeds 0 --device cuda --no-progress --out "$RESULTS/yahoo_$model"
done
step 80 core_speed $PY bench/core_speed.py --iterations 300 --impute-rows 540
tar -czf "$OUT/results.tgz" -C "$RESULTS" .
