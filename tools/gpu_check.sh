#!/usr/bin/env bash
# Issue 14's GPU checks, in one command on a lent GPU machine (the device tool's `run`, with
# `carry: [".whl"]` from tools/gpu_wheels.sh): installs the carried wheels, builds the C++
# extensions against the machine's torch and the CUDA library (make cuda), then runs
#   1. the gpu-marked tests (tests/embedding_store: the CUDA ops, the device tier, the GPU
#      cache, the wiring) against the CPU core,
#   2. the same under compute-sanitizer (memcheck, then racecheck),
#   3. bench/embedding_store_gpu.py,
# writing each log under $OUT (or build/gpu-check where OUT is unset).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
# the project against the machine's torch (pyproject pins the CPU machines' torch: no deps)
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site . \
  >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
make cuda >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export STREAMREC_CUDA_LIB=$PWD/build/cuda/libstreamrec_cuda.so
GPU_TESTS="tests/embedding_store/test_cuda_ops.py tests/embedding_store/test_cuda_device_tier.py
  tests/embedding_store/test_device_cache.py tests/embedding_store/test_device_wiring.py"
rc=0
python3 -m pytest -q -p no:cacheprovider $GPU_TESTS 2>&1 | tee "$OUT/gpu-tests.log" | tail -5
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 --target-processes all \
    python3 -m pytest -q -x -p no:cacheprovider -m gpu $GPU_TESTS \
    >"$OUT/sanitizer-$tool.log" 2>&1
  s=$?; echo "compute-sanitizer $tool: exit $s"; tail -3 "$OUT/sanitizer-$tool.log"
  [ $s = 0 ] || rc=1
done
python3 bench/embedding_store_gpu.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
exit $rc
