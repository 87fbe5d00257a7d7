"""Does a compile pool save the measuring worker's compile on a GPU?

The pool's workers launch nothing: they build through Triton's JIT warm-up into its on-disk
cache; the measuring worker then launches the same kernel through the JIT. That is a saving only
if both build the same cache key (a cross-compile in a process that saw no GPU did not: measured
2026-12-03, the first launch after it recompiled). This probe builds some candidates through a real
CompilePool, then times the first launch in this (GPU) process of those candidates against
candidates that no one compiled before: a cache hit loads in milliseconds, a miss compiles again.

    bash benchmarks/gpu_run.sh python3 benchmarks/ops/pool_cache_probe.py --out $OUT/pool_probe.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from portkern.backends import get_backend
from portkern.backends.base import Artifact, Candidate
from portkern.hwprofile import load_target
from portkern.search.worker import CompilePool, TrialJob
from portkern.synthetic import gemm_task, layernorm_task
from portkern.verify import make_inputs


def first_launch_seconds(backend: Any, task: Any, artifact: Any) -> float:
    program = backend.load(artifact, task)
    inputs = [backend.to_device(a) for a in make_inputs(task, 3, "normal")]
    outputs = [backend.empty(spec, 0.0) for spec in task.outputs]
    backend.synchronize()
    start = time.perf_counter()
    program(inputs, outputs)
    backend.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    target = load_target("h200")
    backend = get_backend(target)
    cases = [gemm_task(4096, 768, 768, "float16", trans_b=True, bias=True),
             gemm_task(4096, 3072, 768, "float16", bias=True, activation="gelu"),
             layernorm_task(4096, 768, "float16")]
    rows = []
    with tempfile.TemporaryDirectory() as scratch, CompilePool(target, 2, 300, Path(scratch)) as pool:
        for task in cases:
            for variant in backend.variants(task):
                pooled, fresh = dict(variant.default), None
                for name, choices in variant.space.items():  # a valid neighbour nobody compiled
                    for value in choices:
                        other = {**pooled, name: value}
                        if other != pooled and backend.check(Candidate.of(variant, other), task) is None:
                            fresh = other
                            break
                    if fresh:
                        break
                if backend.check(Candidate.of(variant, pooled), task) or fresh is None:
                    continue
                job = TrialJob(task=task, candidate=Candidate.of(variant, pooled), floor_seconds=0.0)
                started = time.perf_counter()
                artifact, status, reason = pool.collect(pool.submit(job))
                pool_seconds = time.perf_counter() - started
                if artifact is None:
                    rows.append({"variant": variant.name, "status": status, "reason": reason[:300]})
                    continue
                hit = first_launch_seconds(backend, task, artifact)
                never_built = Artifact(backend=backend.name, variant=variant.name, config=fresh, source=variant.source)
                miss = first_launch_seconds(backend, task, never_built)
                rows.append({"task": task.label, "variant": variant.name, "pool_build_s": pool_seconds,
                             "first_launch_after_pool_s": hit, "first_launch_never_built_s": miss})
                print(f"{task.label:48s} {variant.name:18s} pool build {pool_seconds:6.2f} s, then first launch "
                      f"{hit * 1e3:8.1f} ms (a config never built: {miss * 1e3:6.1f} ms)", flush=True)
    args.out.write_text(json.dumps({"device": backend.fingerprint(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
