"""Exhaustive tables of the Triton GEMM space on a GPU, for the search-efficiency replay
(efficiency.py --table FILE) and as the variant library's ceiling next to cuBLAS.

    bash benchmarks/gpu_run.sh python3 benchmarks/search/gpu_table.py --budget-seconds 420 --out $OUT/table.json

The space: gemm_tma and gemm_tiled, each over a declared sub-space of its SPACE (SUBSPACE below:
the values the tuner's search picks among on an H200, minus GROUP_M 4/16 and the deeper/shallower
pipelines of gemm_tiled, which the grid runs of 2026-12-02 never found best), every configuration
that passes the backend's check. gemm_splitk and gemm_persistent are left out to keep one sweep
inside a lease; the replay searches exactly what the table holds. Other shapes, dtypes and
variants: --shapes, --dtypes and --subspace (the skinny-GEMM table, for instance:
`--shapes 1x4096x4096,16x11008x4096 --dtypes float16,bfloat16 --subspace 'gemm_stream:SPLIT_K=1/2'`).

Two phases, so compiling does not serialize behind the GPU:
  1. worker processes (one per spare core, each with its own CUDA context) JIT-compile every
     configuration once per specialization class (Triton specializes sizes on divisibility by
     16), filling Triton's on-disk cache;
  2. one process times every configuration on every shape with portkern's harness (device events
     behind a spin kernel), after one check of its output against a float32 torch reference with
     TF32 off at the tolerance of its declared precision (a failing configuration is recorded
     'rejected' with its error, not timed). cuBLAS (torch.matmul) is timed the same way per shape.
The table is rewritten after every shape, so a run cut short keeps the shapes it finished.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import datetime
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
import triton

from portkern.backends import get_backend
from portkern.backends.base import Artifact, Backend, Candidate, Variant
from portkern.backends.triton import baselines
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, device_inputs, time_program
from portkern.search.records import Measurement
from portkern.search.strategy import all_configs
from portkern.synthetic import gemm_task
from portkern.tasks import Task
from portkern.verify import make_inputs, tolerance_for

Case = tuple[int, int, int, str]  # M, N, K, dtype
SHAPES: tuple[tuple[int, int, int], ...] = (  # M, N, K: BERT-base/large, LLaMA-7B layers, decode-ish, odd
    (128, 768, 768), (512, 768, 3072), (512, 3072, 768), (2048, 768, 768), (4096, 768, 3072),
    (4096, 3072, 768), (1024, 4096, 4096), (256, 1024, 1024), (3000, 1000, 777), (4096, 4096, 11008))
SUBSPACE: dict[str, dict[str, tuple[Any, ...]]] = {
    "gemm_tma": {"GROUP_M": (1, 8)},
    "gemm_tiled": {"BLOCK_K": (32, 64, 128), "GROUP_M": (1, 8), "num_warps": (4, 8), "num_stages": (3, 4)},
}
MEASURE = MeasureOptions(warmup=2, repeats=10, input_sets=2, max_seconds=0.15)


def shape_task(m: int, n: int, k: int, dtype: str) -> Task:
    return gemm_task(m, n, k, dtype, trans_b=True)


def specialization(m: int, n: int, k: int, dtype: str) -> tuple[Any, ...]:
    """Triton's JIT compiles one binary per dtype, divisibility-by-16 pattern of its integer
    arguments and row count class (the skinny kernels pad M to a power of two: a constexpr)."""
    return (dtype, min(triton.next_power_of_2(m), 128), *(v % 16 == 0 for v in (m, n, k)))


def parse_cases(shapes: str, dtypes: str) -> tuple[Case, ...]:
    """--shapes 'MxNxK,...' x --dtypes 'float16,...'."""
    dims = [tuple(int(d) for d in shape.split("x")) for shape in shapes.split(",") if shape]
    if any(len(d) != 3 for d in dims):
        raise SystemExit(f"--shapes wants MxNxK entries, got {shapes!r}")
    return tuple((m, n, k, dtype) for dtype in dtypes.split(",") if dtype for m, n, k in dims)


def parse_subspace(items: list[str]) -> dict[str, dict[str, tuple[Any, ...]]]:
    """--subspace 'VARIANT:PARAM=a/b;PARAM=c' (repeatable): each named variant over those values."""
    def literal(text: str) -> Any:
        return int(text) if text.lstrip("-").isdigit() else {"True": True, "False": False}.get(text, text)

    found = {}
    for item in items:
        variant, _, params = item.partition(":")
        found[variant] = {name: tuple(literal(v) for v in values.split("/"))
                          for name, _, values in (p.partition("=") for p in params.split(";") if p)}
    return found


def space_entries(backend: Backend, task: Task) -> list[tuple[str, dict[str, Any], str | None]]:
    """(variant, config, why invalid or None) over the sub-space of each table variant."""
    entries = []
    for variant in backend.variants(task):
        if variant.name not in SUBSPACE:
            continue
        space = {**variant.space, **SUBSPACE[variant.name]}
        for config in all_configs(dataclasses.replace(variant, space=space)):
            entries.append((variant.name, config, backend.check(Candidate.of(variant, config), task)))
    return entries


def _program(backend: Backend, task: Task, variant: Variant, config: dict[str, Any]) -> Any:
    artifact = Artifact(backend=backend.name, variant=variant.name, config=config, source=variant.source)
    return backend.load(artifact, task)


def _variant(backend: Backend, task: Task, name: str) -> Variant:
    return next(v for v in backend.variants(task) if v.name == name)


_WORKER_BACKEND: Backend | None = None


def _compile_one(target: str, case: Case, variant_name: str, config: dict[str, Any]) -> tuple[str, float]:
    """Phase 1, in a worker: run once so Triton's JIT builds (and caches) the binary."""
    global _WORKER_BACKEND
    if _WORKER_BACKEND is None:
        _WORKER_BACKEND = get_backend(load_target(target))
    backend, task = _WORKER_BACKEND, shape_task(*case)
    start = time.perf_counter()
    try:
        inputs = [backend.to_device(a) for a in make_inputs(task, 5, "normal")]
        outputs = [backend.empty(spec, 0.0) for spec in task.outputs]
        _program(backend, task, _variant(backend, task, variant_name), config)(inputs, outputs)
        backend.synchronize()
        return "", time.perf_counter() - start
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}", \
            time.perf_counter() - start


def warm_cache(backend: Backend, cases: tuple[Case, ...], workers: int, deadline: float) -> dict[tuple, str]:
    """Phase 1: compile each (specialization class, variant, config) once; compile errors by key."""
    jobs: dict[tuple, tuple[Case, str, dict[str, Any]]] = {}
    for case in cases:
        for variant_name, config, invalid in space_entries(backend, shape_task(*case)):
            key = (specialization(*case), variant_name, json.dumps(config, sort_keys=True))
            if invalid is None and key not in jobs:
                jobs[key] = (case, variant_name, config)
    print(f"phase 1: {len(jobs)} compiles on {workers} workers", flush=True)
    errors: dict[tuple, str] = {}
    started = time.perf_counter()
    with futures.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        pending = {pool.submit(_compile_one, backend.target.name, *job): key for key, job in jobs.items()}
        done = 0
        for future in futures.as_completed(pending):
            error, _ = future.result()
            if error:
                errors[pending[future]] = error
            done += 1
            if done % 100 == 0:
                print(f"  compiled {done}/{len(jobs)} in {time.perf_counter() - started:.0f} s", flush=True)
            if time.time() > deadline:
                print("  phase 1 deadline: the rest compiles in phase 2", flush=True)
                for f in pending:
                    f.cancel()
                break
    print(f"phase 1: {time.perf_counter() - started:.0f} s, {len(errors)} compile errors", flush=True)
    return errors


def reference(task: Task, inputs: list[torch.Tensor]) -> torch.Tensor:
    a, b = inputs[0].float(), inputs[1].float()
    return a @ (b.T if task.attr("trans_b", False) else b)


def check(out: torch.Tensor, want: torch.Tensor, tol: float) -> str | None:
    """Why the output fails (non-finite or relative L2 over tol), else None. On the device, not
    verify.compare: 8,000 entries' outputs copied to the host would cost minutes of the lease."""
    if not bool(torch.isfinite(out).all()):
        return "non-finite or unwritten output"
    rel = float(torch.linalg.vector_norm(out.float() - want) / torch.linalg.vector_norm(want))
    return None if rel <= tol else f"relative L2 error {rel:.3g} > {tol:.1g}"


def time_shape(backend: Backend, case: Case, errors: dict[tuple, str]) -> dict[str, Any]:
    """Phase 2 for one case: every entry checked and timed, and cuBLAS beside them."""
    task = shape_task(*case)
    sets = device_inputs(backend, task, MEASURE.input_sets)
    want = reference(task, sets[0])
    # torch's result as it returns it (the baseline Program also copies it into an output buffer,
    # which the committed 2026-12-03 table counted: its cublas_seconds are up to 40% high)
    compute = baselines.for_task(task)
    cublas_times = [backend.time_once(lambda s=sets[i % len(sets)]: compute(s)) for i in range(MEASURE.repeats)]
    cublas = Measurement(times=cublas_times, method="torch compute, output not copied")
    variants = {v.name: v for v in backend.variants(task)}
    entries = []
    for variant_name, config, invalid in space_entries(backend, task):
        entry: dict[str, Any] = {"variant": variant_name, "config": config, "seconds": None}
        error = errors.get((specialization(*case), variant_name, json.dumps(config, sort_keys=True)))
        if invalid is not None or error:
            entry.update(status="invalid" if invalid else "compile_error", reason=invalid or error)
            entries.append(entry)
            continue
        try:
            variant = variants[variant_name]
            program = _program(backend, task, variant, config)
            out = backend.empty(task.outputs[0], float("nan"))
            program(sets[0], [out])
            backend.synchronize()
            wrong = check(out, want, tolerance_for(variant.precision, task))
            if wrong:
                entry.update(status="rejected", reason=wrong)
            else:
                measurement = time_program(backend, program, task, MEASURE, sets)
                entry.update(status="ok", reason="", seconds=measurement.median, spread=measurement.spread)
        except Exception as exc:
            entry.update(status="runtime_error", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
        entries.append(entry)
    timed = [e for e in entries if e["seconds"] is not None]
    best = min(timed, key=lambda e: e["seconds"], default=None)
    m, n, k, dtype = case
    return {"case": f"gemm {m}x{n}x{k} {dtype}",
            "task": {"kind": "gemm", "m": m, "n": n, "k": k, "dtype": dtype,
                     "trans_b": True, "bias": False, "activation": "none", "residual": False},
            "flops": task.flops, "min_bytes": task.min_bytes, "cublas_seconds": cublas.median,
            "best": best and {"variant": best["variant"], "config": best["config"], "seconds": best["seconds"],
                              "tflops": task.flops / best["seconds"] / 1e12,
                              "tbps": task.min_bytes / best["seconds"] / 1e12,
                              "vs_cublas": cublas.median / best["seconds"]},
            "entries": entries, "complete": True}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--budget-seconds", type=float, default=420)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--compile-share", type=float, default=0.55, help="share of the budget for phase 1")
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                        help="MxNxK,... (default: the BERT/LLaMA/odd table's shapes)")
    parser.add_argument("--dtypes", default="float16", help="comma-separated: float16,bfloat16,float32")
    parser.add_argument("--subspace", action="append", default=[],
                        help="VARIANT:PARAM=a/b;PARAM=c, repeatable; replaces the default SUBSPACE (gemm_tma, "
                             "gemm_tiled): the table holds exactly the variants named")
    parser.add_argument("--target", default="h200", help="the hwprofile the table is for (h200, h100, ...): "
                        "its priors are made from tables of that card")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true",
                        help="two tiny shapes and a few configs in the Triton interpreter: checks the script on a CPU")
    args = parser.parse_args()
    global SUBSPACE
    if args.smoke:
        args.shapes = "40x48x32,33x40x24"
        SUBSPACE = {"gemm_tiled": {"BLOCK_M": (32,), "BLOCK_N": (32, 64), "BLOCK_K": (32,), "GROUP_M": (1,),
                                   "num_warps": (4,), "num_stages": (3,)}}
    elif args.subspace:
        SUBSPACE = parse_subspace(args.subspace)
    cases = parse_cases(args.shapes, args.dtypes)
    started = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    backend = get_backend(load_target(args.target))
    errors = warm_cache(backend, cases, args.workers, started + args.compile_share * args.budget_seconds)
    table: dict[str, Any] = {
        "device": backend.fingerprint()["device"], "target": args.target, "backend": "triton",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv), "versions": {**backend.fingerprint(), "python": platform.python_version(),
                                                    "triton": triton.__version__},
        "method": (f"each entry: one output check vs a float32 torch reference (TF32 off), then portkern's "
                   f"harness {MEASURE} ({backend.timing_method}); cuBLAS = torch.matmul timed alike"),
        "subspace": {name: {k: list(v) for k, v in values.items()} for name, values in SUBSPACE.items()},
        "cases": []}
    for case in cases:
        if time.time() > started + args.budget_seconds:
            print(f"budget spent before {case}", flush=True)
            break
        case_started = time.time()
        row = time_shape(backend, case, errors)
        table["cases"].append(row)
        args.out.write_text(json.dumps(table, separators=(",", ":")))  # ~8k entries: compact
        best = row["best"] or {}
        ok = sum(e["status"] == "ok" for e in row["entries"])
        print(f"{row['case']:30s} {ok:4d} ok / {len(row['entries'])} entries  cuBLAS "
              f"{row['flops'] / row['cublas_seconds'] / 1e12:6.1f} TFLOP/s "
              f"{row['min_bytes'] / row['cublas_seconds'] / 1e12:5.2f} TB/s  best "
              f"{best.get('tflops', 0):6.1f} TFLOP/s {best.get('tbps', 0):5.2f} TB/s "
              f"({best.get('vs_cublas', 0):.2f}x) {best.get('variant')} {best.get('config')}  "
              f"[{time.time() - case_started:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
