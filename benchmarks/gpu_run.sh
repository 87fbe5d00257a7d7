#!/usr/bin/env bash
# On the lent GPU machine: install carried wheels (Optuna) and portkern, then run what is asked.
#   bash benchmarks/gpu_run.sh python benchmarks/ops/bench_ops.py --suite memory --out $OUT/ops.json
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/pip-portkern.log 2>&1 || {
  cat /tmp/pip-portkern.log; exit 1; }
export PYTHONUNBUFFERED=1
# the machine and versions, printed and kept beside the call's results: a log alone names no device
{ date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
  python3 -c "import torch, triton, optuna; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'optuna', optuna.__version__, torch.cuda.get_device_name())"
} | tee "${OUT:-.}/device.txt"
"$@"
