#!/usr/bin/env bash
# The GPU checks on a lent GPU machine, one step per call, each well inside a 10-minute run
# limit (the device tool's `run`, with `carry: [".whl"]` from tools/gpu_wheels.sh); the steps
# share the machine's state (build/gpu-site, build/cuda) while it stays warm:
#
#   tools/gpu_check.sh first       what a GPU day checks first, stopping at the first failure:
#                                  install; the driver r580+ (the library links CUDA 13's
#                                  runtime statically) and nvidia-smi's GPU count equal to
#                                  torch's; build; the bit-identical, initializer, hot-key and
#                                  padded-row tests (CPU build and GPU parameters)
#   tools/gpu_check.sh install     the carried wheels, then the project against the machine's
#                                  torch, --upgrade (a warm machine's older copy is replaced)
#   tools/gpu_check.sh build       the CUDA library (make cuda: sm_80/sm_90 SASS, compute_90 PTX)
#   tools/gpu_check.sh tests       the gpu-marked tests (CPU build and GPU parameters)
#   tools/gpu_check.sh memcheck    compute-sanitizer memcheck over the GPU parameters, torch's
#                                  caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: an
#                                  overrun inside a cached block is otherwise invisible)
#   tools/gpu_check.sh racecheck   shared-memory races (racecheck sees shared memory only: the
#                                  index's global-memory protocol is checked under TSan on the
#                                  CPU, tests/embedding_store/test_cuda_race.py, make sanitize)
#   tools/gpu_check.sh initcheck   reads of uninitialised device memory
#   tools/gpu_check.sh synccheck   misuse of barriers and warp-synchronous calls
#   tools/gpu_check.sh bench       bench/embedding_store_gpu.py
#   tools/gpu_check.sh trainer     the trainer on the GPU (after install; no CUDA library needed:
#                                  its store is in-process on the host): its gpu-marked tests
#                                  (pinned staging, a pass on the GPU against the CPU's, bf16),
#                                  then bench/trainer.py --device cuda --setup b --full against
#                                  the reference step on the same GPU (3-6 min in all)
#   tools/gpu_check.sh all         first, then tests .. bench in this order (no run limit)
#   tools/gpu_check.sh speed       issue 44's checks and figures in at most 8 minutes in all
#                                  (SPEED_STEPS), each step printed as it comes: install (the
#                                  rest is skipped when it fails); build (make cuda); the
#                                  gpu-marked tests at their GPU parameters (the CPU build's
#                                  run on every CPU machine); bench/host_pipeline.py on this
#                                  host's cores; bench/trainer.py --device cuda --setup b --full
#                                  (precision auto), store tier host then device;
#                                  bench/embedding_store_gpu.py (4M rows, 5 steps);
#                                  compute-sanitizer memcheck, racecheck, initcheck, synccheck
#                                  over a few op tests' GPU parameters (SPEED_SANITIZE_K).
#                                  SPEED_STEPS gives each step's limit: a step must end by the
#                                  start + the limits up to it (time one leaves goes to the
#                                  next; one with under MIN_STEP_S left is skipped, said so).
#                                  Every log in $OUT/speed-logs.tar.gz, the lines in
#                                  $OUT/speed.log. Carrying build/cuda (built here by
#                                  `make cuda`) saves the build where make finds it current.
#
# Logs go under $OUT (or build/gpu-check where OUT is unset). compute-sanitizer may be refused
# on a sandboxed host: the step then fails saying so in its log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
#: this script, for the speed run's steps (each a process of its own under timeout)
SELF=$PWD/tools/$(basename "$0")
OUT=${OUT:-build/gpu-check}
SITE=$PWD/build/gpu-site
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export STREAMREC_CUDA_LIB=$PWD/build/cuda/libstreamrec_cuda.so
GPU_TESTS="tests/embedding_store/test_cuda_ops.py tests/embedding_store/test_device_block.py tests/embedding_store/test_cuda_hazards.py
  tests/embedding_store/test_cuda_device_tier.py tests/embedding_store/test_device_cache.py
  tests/embedding_store/test_device_wiring.py tests/embedding_store/test_device_rows.py
  tests/embedding_store/test_device_staging.py"

#: the op tests compute-sanitizer runs over (pytest -k): their GPU parameters
SANITIZE_K=${SANITIZE_K:-[cuda}

sanitize() {  # compute-sanitizer --tool $1 over the GPU parameters ([cuda...]) of the op tests
  local tool=$1
  shift
  "$@" compute-sanitizer --tool "$tool" --error-exitcode 9 --target-processes all \
    python3 -m pytest -q -x -p no:cacheprovider -m gpu -k "$SANITIZE_K" \
    tests/embedding_store/test_cuda_ops.py tests/embedding_store/test_cuda_hazards.py \
    >"$OUT/sanitizer-$tool.log" 2>&1
  local s=$?
  echo "compute-sanitizer $tool: exit $s"
  tail -3 "$OUT/sanitizer-$tool.log"
  return $s
}

#: the driver the statically linked CUDA 13 runtime needs, at least
MIN_DRIVER=580
FIRST_TESTS="bit_identical or initializers or hot_key or padded"
TRAINER_GPU_TESTS="tests/trainer/test_staging.py tests/trainer/test_device.py
  tests/trainer/test_precision.py"
#: seconds the trainer bench may take (with its tests the step stays under 6 minutes; each
#: figure is logged as it comes, so a bench cut short still says what it measured)
TRAINER_BENCH_S=300
#: nvcc for `make cuda`: the gencode targets of a file compiled side by side
NVCC_BUILD="nvcc --threads 0"

#: speed: each step's limit in seconds, in order; 480 in all (8 minutes)
SPEED_STEPS=${SPEED_STEPS:-"install:50 build:70 tests:70 host:20 trainer-host:55
  trainer-device:75 store:40 memcheck:25 racecheck:25 initcheck:25 synccheck:25"}
#: speed: a step with less time than this left is skipped
MIN_STEP_S=5
#: speed: the op tests compute-sanitizer runs over, so each tool fits its limit: 3 (creation
#: with repeats, gather and bag pooling, an AdaGrad update)
SPEED_OPS="find_or_insert_matches or gather_and_bag or (update_is_bit_identical and 33-SparseAdaGrad)"
SPEED_SANITIZE_K=${SPEED_SANITIZE_K:-"[cuda and ($SPEED_OPS)"}

drivers() {  # the driver's major version and nvidia-smi's GPU count against torch's
  local driver count torch_count
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
  count=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
  torch_count=$(python3 -c 'import torch; print(torch.cuda.device_count())') || return 1
  echo "driver $driver; GPUs: $count by nvidia-smi, $torch_count by torch"
  if ! [ "${driver%%.*}" -ge "$MIN_DRIVER" ] 2>/dev/null; then
    echo "driver '$driver' is not r$MIN_DRIVER or newer, which the library's CUDA 13 runtime" \
      "(linked statically) needs: every op would fail with ERR_CUDA" >&2
    return 1
  fi
  if [ "$count" != "$torch_count" ]; then
    echo "nvidia-smi sees $count GPU(s), torch $torch_count (CUDA_VISIBLE_DEVICES?)" >&2
    return 1
  fi
}

step() {
  case $1 in
    first)
      step install && drivers && step build || return 1
      # shellcheck disable=SC2086
      python3 -m pytest -q -p no:cacheprovider -m gpu -k "$FIRST_TESTS" $GPU_TESTS 2>&1 |
        tee "$OUT/first-tests.log" | tail -5
      return "${PIPESTATUS[0]}" ;;
    install)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || return 1
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
      # the project against the machine's torch (pyproject pins the CPU machines' torch)
      python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target "$SITE" . \
        >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; return 1; } ;;
    build)
      make cuda NVCC="$NVCC_BUILD" >>"$OUT/build.log" 2>&1 ||
        { tail -30 "$OUT/build.log"; return 1; }
      # load() refuses a library whose runtime sees other than torch's devices (old driver)
      python3 -c 'from streamrec.embedding_store.tiers import cuda_ext as c
n = c.load().lib.streamrec_cuda_device_count(); print(f"the CUDA extension sees {n} GPU(s)")' ;;
    tests)
      # shellcheck disable=SC2086
      python3 -m pytest -q -p no:cacheprovider -m gpu $GPU_TESTS 2>&1 |
        tee "$OUT/gpu-tests.log" | tail -5
      return "${PIPESTATUS[0]}" ;;
    memcheck) sanitize memcheck env PYTORCH_NO_CUDA_MEMORY_CACHING=1 ;;
    racecheck | initcheck | synccheck) sanitize "$1" ;;
    trainer)
      local tests_rc bench_rc
      # shellcheck disable=SC2086
      python3 -m pytest -q -p no:cacheprovider -m gpu $TRAINER_GPU_TESTS 2>&1 |
        tee "$OUT/trainer-tests.log" | tail -5
      tests_rc=${PIPESTATUS[0]}
      timeout "$TRAINER_BENCH_S" python3 bench/trainer.py --device cuda --setup b --full 2>&1 |
        tee "$OUT/trainer-bench.txt"
      bench_rc=${PIPESTATUS[0]}
      echo "trainer: tests exit $tests_rc, bench exit $bench_rc (124: past ${TRAINER_BENCH_S} s)"
      [ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ] ;;
    bench)
      python3 bench/embedding_store_gpu.py --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
      return "${PIPESTATUS[0]}" ;;
    speed) speed ;;
    speed-tests)  # the GPU parameters only: the CPU build's are every CPU machine's tests
      # shellcheck disable=SC2086
      python3 -m pytest -q -p no:cacheprovider -m gpu -k "not [cpu" $GPU_TESTS \
        $TRAINER_GPU_TESTS 2>&1 | tee "$OUT/speed-tests.log" | tail -8
      return "${PIPESTATUS[0]}" ;;
    speed-host)
      python3 bench/host_pipeline.py --samples 204800 --reps 5 --workers 2 4 8 2>&1 |
        tee "$OUT/host-pipeline.txt"
      return "${PIPESTATUS[0]}" ;;
    speed-trainer-host | speed-trainer-device)
      python3 bench/trainer.py --device cuda --setup b --full --precision auto \
        --store-tier "${1#speed-trainer-}" 2>&1 | tee "$OUT/$1.txt"
      return "${PIPESTATUS[0]}" ;;
    speed-store)
      python3 bench/embedding_store_gpu.py --capacity 4194304 --steps 5 \
        --json "$OUT/store-bench.json" 2>&1 | tee "$OUT/store-bench.txt"
      return "${PIPESTATUS[0]}" ;;
    speed-memcheck | speed-racecheck | speed-initcheck | speed-synccheck)
      SANITIZE_K=$SPEED_SANITIZE_K step "${1#speed-}" ;;
    speed-install) step install ;;
    speed-build) drivers && step build ;;
    *) echo "unknown step '$1' (first install build tests memcheck racecheck initcheck synccheck" \
      "bench trainer speed all)" >&2
      return 2 ;;
  esac
}

say() {  # a line of the speed run: on stdout and in $SPEED_LOG
  echo "$*" | tee -a "$SPEED_LOG"
}

speed() {  # the steps of SPEED_STEPS, each in this script under `timeout` (see the header)
  local start=$SECONDS due=0 total=0 failed="" skipped="" entry name left began rc late
  local logs=build/gpu-check/speed
  SPEED_LOG=$OUT/speed.log
  rm -rf "$logs" && mkdir -p "$logs" && : >"$SPEED_LOG"
  for entry in $SPEED_STEPS; do total=$((total + ${entry#*:})); done
  say "speed: $(date -u +%FT%TZ), at most $total s in all (SPEED_STEPS)"
  for entry in $SPEED_STEPS; do
    name=${entry%%:*}
    due=$((due + ${entry#*:}))
    left=$((due - (SECONDS - start)))
    if [[ "$failed" == *install* ]]; then
      say "== $name: SKIPPED (install failed)"
      skipped="$skipped $name"
      continue
    fi
    if [ "$left" -lt "$MIN_STEP_S" ]; then
      say "== $name: SKIPPED (${left} s left of its time)"
      skipped="$skipped $name"
      continue
    fi
    say "== $name (at most $left s)"
    began=$SECONDS
    # its own process group under timeout: a step cut short takes its children with it
    OUT=$logs timeout -k 5 "$left" "$SELF" "speed-$name" 2>&1 | tee -a "$SPEED_LOG"
    rc=${PIPESTATUS[0]}
    case $rc in 124 | 137) late=" (out of time)" ;; *) late="" ;; esac
    say "== $name: exit $rc in $((SECONDS - began)) s$late"
    [ "$rc" = 0 ] || failed="$failed $name"
  done
  tar czf "$OUT/speed-logs.tar.gz" -C "$logs" . 2>/dev/null
  say "speed: $((SECONDS - start)) s in all; failed:${failed:- none}; skipped:${skipped:- none}"
  [ -z "$failed$skipped" ]
}

[ $# -eq 1 ] || { echo "usage: tools/gpu_check.sh STEP (see the header)" >&2; exit 2; }
if [ "$1" = all ]; then
  rc=0
  for s in first tests memcheck racecheck initcheck synccheck bench; do
    echo "== $s"; step "$s" || rc=1
  done
  exit $rc
fi
step "$1"
