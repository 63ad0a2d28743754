#!/usr/bin/env bash
# Downloads, for Python 3.12 on x86-64, the wheels of the runtime dependencies the GPU
# machines lack (their image has torch 2.11 + CUDA 13, numpy, pyarrow, pyyaml, msgpack,
# prometheus-client, pytest, hypothesis, httpx; not pyzmq, pydantic, fastapi, uvicorn, redis)
# into .whl/ (git-ignored), for tools/gpu_check.sh to install there without a network.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PY=${PY:-.venv/bin/python}
# the versions this machine's venv runs, so both sides test the same code
pins=$($PY -m pip list --format=freeze 2>/dev/null | grep -iE \
  '^(pyzmq|pydantic|pydantic[-_]core|annotated[-_]types|typing[-_]inspection|fastapi|starlette|uvicorn|redis)==' || true)
for pin in $pins; do
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$pin" \
    || { echo "gpu_wheels: no py3.12 x86-64 wheel of $pin" >&2; exit 1; }
done
ls .whl
