"""What the gate's float64 reference costs, and that the backend's computes the executor's.

The gate checks every candidate against its task's subgraph run in float64 (verify.py). On the
host a ResNet-50 conv's reference takes seconds; the Triton backend runs it as device glue in
float64 (Backend.reference). For each task: both times, and their largest relative difference.

    bash benchmarks/gpu_run.sh python3 benchmarks/ops/reference_cost.py --out $OUT/reference-cost.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

from portkern.backends import get_backend
from portkern.hwprofile import load_target
from portkern.synthetic import attention_task, conv2d_task, gemm_task, layernorm_task, pool_task
from portkern.tasks import Task
from portkern.verify import make_inputs

TASKS = {  # ResNet-50 and BERT-base tasks at batch 32, as the tuner sees them on an H200
    "conv 1x1 64->256 56px +residual+relu": lambda: conv2d_task(32, 64, 56, 56, 256, 1, 1, "float16",
                                                              activation="relu", residual=True, nhwc=True),
    "conv 3x3 64ch 56px +relu": lambda: conv2d_task(32, 64, 56, 56, 64, 3, 3, "float16", pad=1,
                                                    activation="relu", nhwc=True),
    "conv 7x7/2 stem": lambda: conv2d_task(32, 3, 224, 224, 64, 7, 7, "float16", stride=2, pad=3,
                                           activation="relu", nhwc=True),
    "maxpool 3x3/2 112px": lambda: pool_task(32, 64, 112, 112, "max", kernel=3, stride=2, pad=1,
                                             dtype="float16", nhwc=True),
    "gemm 4096x3072x768 +gelu": lambda: gemm_task(4096, 3072, 768, "float16", bias=True, activation="gelu",
                                                 trans_b=True),
    "attention b32 h12 s128 d64": lambda: attention_task(32, 12, 128, 64, "float16", mask=True),
    "layernorm 4096x768": lambda: layernorm_task(4096, 768, "float16"),
}


def measure(task: Task, backend: object) -> dict[str, float]:
    inputs = make_inputs(task, 11, "normal")
    started = time.perf_counter()
    host = task.reference(inputs)
    host_s = time.perf_counter() - started
    backend.reference(task, inputs)  # warm-up: cuDNN/cuBLAS handles and plans
    started = time.perf_counter()
    device = backend.reference(task, inputs)
    device_s = time.perf_counter() - started
    diff = max(float(np.max(np.abs(h - d)) / (np.max(np.abs(h)) or 1.0)) for h, d in zip(host, device))
    return {"host_seconds": host_s, "backend_seconds": device_s, "max_rel_difference": diff}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="h200")
    parser.add_argument("--out", type=Path, default=Path("reference-cost.json"))
    args = parser.parse_args()
    backend = get_backend(load_target(args.target))
    rows = []
    for name, make in TASKS.items():
        row = {"task": name, **measure(make(), backend)}
        rows.append(row)
        print(f"{name:40s} host {row['host_seconds']:7.3f} s  {backend.name} {row['backend_seconds']:7.4f} s  "
              f"max rel diff {row['max_rel_difference']:.1e}", flush=True)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), **backend.fingerprint(), "rows": rows}
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
