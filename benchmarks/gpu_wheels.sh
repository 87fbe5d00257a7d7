#!/usr/bin/env bash
# Here (a machine with PyPI): the wheels the lent GPU machine lacks, into .whl/ for `carry`.
# The machine has torch, Triton, numpy, onnx and onnxruntime; portkern also needs Optuna (and its
# own needs) and threadpoolctl. gpu_run.sh installs whatever lies in .whl/ there.
#   bash benchmarks/gpu_wheels.sh      (.whl/ is in .gitignore; run with carry [".whl"])
set -euo pipefail
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  optuna alembic sqlalchemy greenlet mako markupsafe colorlog tqdm threadpoolctl pytest-timeout
ls .whl
