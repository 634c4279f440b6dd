#!/usr/bin/env bash
# Downloads, here (where PyPI is reachable), the wheels that a bare CUDA image with torch lacks for
# srt-agent, for a device machine that has no network: carry the folder there and install them with
#   python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site
# before `bash benchmarks/gpu_check.sh` (which names any dependency still missing).
# Usage: bash benchmarks/gpu_wheels.sh [DIR] (default .whl; PY_VERSION, default 3.12: the image's Python).
set -euo pipefail
dir=${1:-.whl}
py_version=${PY_VERSION:-3.12}
mkdir -p "$dir"
python3 -m pip download --only-binary=:all: --python-version "$py_version" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$dir" gymnasium pydantic bm25s starlette uvicorn tenacity
# The image's numpy stays: its torch was built against it, and a second one on PYTHONPATH would shadow it.
rm -f "$dir"/numpy-*.whl
ls "$dir"
