"""Where one trial's time goes: compile, load, the gate's references, the gate, timing.

A trial runs here in process (search.worker.execute_trial, as the tune's worker runs it), once per
variant of the task's kind with its DEFAULT config, on a model-sized GEMM. It is what sizes the trial
limits: on the simulated NPU every run of a kernel is interpreted, so the gate's nine runs of a
BERT-base FFN GEMM take minutes on a CPU.

    python benchmarks/search/trial_phases.py --target ascend910b --gemm 4096x3072x768 --activation gelu \
        --out benchmarks/results/npu-sim-trial-phases-DATE.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import triton

from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.hwprofile import load_target
from portkern.search.worker import TrialJob, execute_trial
from portkern.synthetic import gemm_task


def host() -> dict[str, str | int | None]:
    """The machine the trials ran on: an interpreted kernel's time is this CPU's."""
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.exists() else []
    return {"cpu": models[0] if models else platform.processor(), "cores": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(), "numpy": np.__version__,
            "triton": triton.__version__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--gemm", default="4096x3072x768", help="MxNxK")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--activation", default="none")
    parser.add_argument("--variants", default="", help="comma-separated names (default: every variant of the task)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    m, n, k = (int(part) for part in args.gemm.split("x"))
    backend = get_backend(load_target(args.target))
    task = gemm_task(m, n, k, args.dtype, bias=True, activation=args.activation, trans_b=True)
    wanted = set(filter(None, args.variants.split(",")))
    variants = [v for v in backend.variants(task) if not wanted or v.name in wanted]
    if not variants:
        parser.error(f"no variant of {task.label} on {args.target} matches {sorted(wanted) or 'any'}")
    rows = []
    for variant in variants:
        start = time.perf_counter()
        record, _ = execute_trial(backend, TrialJob(task=task, candidate=Candidate.of(variant, variant.default),
                                                    floor_seconds=0.0))
        rows.append({"variant": variant.name, "config": variant.default, "status": record.status,
                     "reason": record.reason[:300], "phases_s": record.phases,
                     "wall_s": time.perf_counter() - start})
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "target": args.target, "task": task.label,
        "device": backend.fingerprint(),  # the simulated NPU's names no GPU: its kernels ran on this host
        "host": host(),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
