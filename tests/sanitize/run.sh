#!/usr/bin/env bash
# make sanitize: builds the C++ extensions with AddressSanitizer + UndefinedBehaviorSanitizer
# into build/sanitize/lib (setup.py's STREAMREC_SANITIZE switch; the installed optimized build
# is never touched), and the CPU build of the CUDA kernels likewise into
# build/sanitize/libstreamrec_cuda_cpu.so (STREAMREC_CUDA_CPU_LIB), and runs the store's (the
# gpu-marked CUDA op and device-tier tests included), the sampler's and the trainer's parser
# tests against them: this directory's sitecustomize.py points the three `_C` imports there,
# for the test processes and every process they spawn. A finding stops the process that hit it and
# fails the run: its report is in build/sanitize/logs (ASan), on this output (UBSan in a test
# process: pytest captures Python's streams only), or in the failing test's server log (a
# spawned server).
#
#   tests/sanitize/run.sh [pytest args]   default: tests/embedding_store tests/sampler
#       tests/trainer/test_data.py tests/trainer/test_line_parser.py
#       tests/trainer/test_slot_parser.py tests/trainer/test_add_rows.py (no CUDA)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-.venv/bin/python}
OUT=$ROOT/build/sanitize
LOGS=$OUT/logs

args=("$@")
# The CUDA build test is left out: it runs nvcc and the host compiler, which the preloaded
# ASan runtime breaks.
[ ${#args[@]} -gt 0 ] || args=(tests/embedding_store tests/sampler
  tests/trainer/test_data.py tests/trainer/test_line_parser.py tests/trainer/test_slot_parser.py
  tests/trainer/test_add_rows.py
  "--ignore=tests/embedding_store/test_cuda_build.py"
  "--ignore=tests/embedding_store/test_cuda_race.py")

mkdir -p "$OUT"
echo "building the sanitized extensions into build/sanitize/lib (log: build/sanitize/build.log)"
STREAMREC_SANITIZE=address,undefined MAX_JOBS=${MAX_JOBS:-2} \
  "$PY" setup.py -q build_ext --build-lib "$OUT/lib" --build-temp "$OUT/temp" >"$OUT/build.log" 2>&1 ||
  { tail -50 "$OUT/build.log"; exit 1; }
echo "building the sanitized CPU build of the CUDA kernels (log: build/sanitize/cuda-cpu.log)"
export STREAMREC_CUDA_CPU_LIB=$OUT/libstreamrec_cuda_cpu.so
"$PY" - >"$OUT/cuda-cpu.log" 2>&1 <<'EOF' || { tail -50 "$OUT/cuda-cpu.log"; exit 1; }
from streamrec.embedding_store.tiers import cuda_lib

# -fno-sanitize=null: Thrust binds references to null pointers of its stateless system tags
# by design (thrust/detail/reference.h); a real null access is still ASan's SEGV report
flags = ("-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
         "-fno-sanitize=null", "-fno-sanitize-recover=all")
print(cuda_lib.build_cpu(extra=flags, force=True))
EOF
rm -rf "$LOGS" && mkdir -p "$LOGS"

# ThreadSanitizer over the CUDA kernels' thread protocols (a build and a driver of their own,
# std::threads instead of OpenMP), before ASan is preloaded: it compiles
echo "ThreadSanitizer: the CUDA kernels' thread protocols (tests/embedding_store/test_cuda_race.py)"
tsan=0
"$PY" -m pytest -q -p no:cacheprovider tests/embedding_store/test_cuda_race.py || tsan=1

export STREAMREC_EXT_DIR=$OUT/lib
export PYTHONPATH=$ROOT/tests/sanitize${PYTHONPATH:+:$PYTHONPATH}
# Python itself is not instrumented: the ASan runtime must be loaded first, and libstdc++
# with it (ASan finds the C++ throw it intercepts at start-up; loaded later with torch, a
# throw fails ASan's check). CPython keeps objects alive at exit by design (no leak check);
# torch refuses huge allocations by raising, which needs malloc to return null, not abort.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:log_path=$LOGS/asan
# (UBSan next to ASan ignores log_path: its reports go to stderr)
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

"$PY" - <<'EOF'
from streamrec.embedding_store import _C
from streamrec.sampler import _C as sampler_C
from streamrec.trainer import _C as trainer_C

for ext in (_C, sampler_C, trainer_C):
    assert "/build/sanitize/lib/" in ext.__file__, ext.__file__
print("sanitized extensions:", _C.__file__, sampler_C.__file__, trainer_C.__file__, sep="\n  ")
EOF
[ $? -eq 0 ] || exit 1

status=0
"$PY" -m pytest -q -p no:cacheprovider --capture=sys "${args[@]}" 2>&1 | tee "$OUT/pytest.log" ||
  status=$?
unset LD_PRELOAD
# a report is an error; a warning (an allocation refused, returned as null) is only shown
if compgen -G "$LOGS/*" >/dev/null; then
  for f in "$LOGS"/*; do echo "-- $f"; head -c 20000 "$f"; done
fi
if grep -q -l -E "ERROR: AddressSanitizer|runtime error:|CHECK failed" "$LOGS"/* "$OUT/pytest.log" 2>/dev/null; then
  echo "sanitizers: reports above (build/sanitize/logs)"
  exit 1
fi
[ $tsan = 0 ] || { echo "sanitizers: ThreadSanitizer reported (above)"; exit 1; }
echo "sanitizers: no report"
exit $status
