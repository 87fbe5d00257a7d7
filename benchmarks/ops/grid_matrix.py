"""Grid benchmark of the Triton matrix variants (gemm, bmm, attention, conv2d): every variant x a
grid of its valid configs, side by side with torch eager (cuBLAS, SDPA, cuDNN) in one run.

    bash benchmarks/gpu_run.sh python benchmarks/ops/grid_matrix.py --out $OUT/grid_matrix_h200.json
    python benchmarks/ops/grid_matrix.py --ops gemm:4096x4096x1024:bias+gelu,attention:4x16x2048x128:causal
    python benchmarks/ops/grid_matrix.py --dry-run      # no GPU needed: tasks, variants and configs

Every candidate goes through the backend like a tune does (compile = Triton's JIT for the real
shapes, with registers/spills/shared memory from the driver; load; run) and is timed by portkern's
harness (portkern.measure: CUDA events around a device-wide synchronize, rotating input sets,
median) - the torch baseline with the same harness on the same inputs. Before its time counts, a
candidate's output is compared with torch on float64 copies of the inputs at the tolerance of its
declared precision. TF32 is off in torch (cuBLAS and cuDNN) unless --allow-tf32, so fp32 rows
compare fp32 with fp32.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import triton

from portkern import synthetic
from portkern.backends import get_backend
from portkern.backends.base import Backend, Candidate, CompileError, Variant
from portkern.backends.triton import baselines
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, device_inputs, time_program
from portkern.tasks import Task
from portkern.verify import compare, tolerance_for

DEFAULT_OPS = ",".join([
    "gemm:4096x4096x4096",
    "gemm:8192x8192x8192",
    "gemm:4096x4096x1024:bias+gelu",         # BERT-large FFN1 at 4096 tokens
    "gemm:4096x1024x4096:bias+residual",     # FFN2
    "gemm:16x8192x8192:trans_b",             # decode-size linear layer
    "gemm:128x128x65536",                    # long K, tiny output: split-K territory
    "bmm:64x512x512x64",
    "attention:4x16x2048x128",
    "attention:4x16x2048x128:causal",
    "attention:8x12x512x64:mask",
    "attention:16x32x1x128:kv=8192",         # one decoding step over an 8k cache
    "conv2d:32x64x56x56x64x3x3:pad=1+relu",  # ResNet-50 stage 1
    "conv2d:32x256x14x14x256x3x3:pad=1",
])
DIMS = {"gemm": 3, "bmm": 4, "attention": 4, "conv2d": 7}
MEASURE = MeasureOptions(warmup=5, repeats=50, input_sets=3, max_seconds=1.0)


def build_task(kind: str, dims: Sequence[int], flags: dict[str, str], dtype: str) -> Task:
    """One task from a parsed --ops entry; flags are the synthetic builders' keyword options."""
    on = {name for name, value in flags.items() if value == ""}
    if kind == "gemm":
        m, n, k = dims
        activation = next((a for a in ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh") if a in on), "none")
        return synthetic.gemm_task(m, n, k, dtype, activation=activation, bias="bias" in on,
                                   residual="residual" in on, trans_b="trans_b" in on)
    if kind == "bmm":
        batch, m, n, k = dims
        return synthetic.bmm_task(batch, m, n, k, dtype)
    if kind == "attention":
        batch, heads, seq, head_dim = dims
        return synthetic.attention_task(batch, heads, seq, head_dim, dtype,
                                        seq_kv=int(flags["kv"]) if "kv" in flags else None, mask="mask" in on,
                                        causal="causal" in on, k_transposed="k_transposed" in on)
    n, c, h, w, oc, kh, kw = dims
    activation = next((a for a in ("relu", "silu", "sigmoid", "tanh") if a in on), "none")
    return synthetic.conv2d_task(n, c, h, w, oc, kh, kw, dtype, stride=int(flags.get("stride", 1)),
                                 pad=int(flags.get("pad", 0)), dilation=int(flags.get("dilation", 1)),
                                 group=int(flags.get("group", 1)), activation=activation,
                                 residual="residual" in on, nhwc="nhwc" in on)


def parse_ops(text: str, dtype: str) -> list[tuple[str, Task]]:
    """'kind:SIZES[:flag+key=value]' entries joined by commas -> (label, task). Flags: bias, residual,
    trans_b and an activation for gemm; mask, causal, k_transposed, kv=SEQ_KV for attention;
    stride=, pad=, dilation=, group=, residual, nhwc (the channels-last graph's task) and an activation
    for conv2d."""
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, rest = item.partition(":")
        shape, _, flag_text = rest.partition(":")
        if kind not in DIMS:
            raise SystemExit(f"unknown op '{kind}' (one of {', '.join(DIMS)})")
        try:
            dims = [int(v) for v in shape.lower().split("x")]
        except ValueError:
            raise SystemExit(f"shape '{shape}' of '{item}' is not integers joined by 'x'") from None
        if len(dims) != DIMS[kind]:
            raise SystemExit(f"{kind} takes {DIMS[kind]} sizes, '{item}' gives {len(dims)}")
        flags = {name: value for name, _, value in (f.partition("=") for f in flag_text.split("+") if f)}
        found.append((f"{item} {dtype}", build_task(kind, dims, flags, dtype)))
    return found


def chosen_variants(backend: Backend, task: Task, only: frozenset[str]) -> list[Variant]:
    """The backend's variants for the task, only those named when any are."""
    return [v for v in backend.variants(task) if not only or v.name in only]


def config_grid(backend: Backend, variant: Variant, task: Task, limit: int, seed: int,
                subspace: dict[str, list[Any]] | None = None) -> list[dict[str, Any]]:
    """DEFAULT (when valid) first, then seeded samples that pass the backend's check: from the
    space, or from the space with the parameters `subspace` names restricted to its values."""
    rng = random.Random(seed)
    default = dict(variant.default)
    space = {name: (subspace or {}).get(name, choices) for name, choices in variant.space.items()}
    pool = [default] + [{name: rng.choice(choices) for name, choices in space.items()}
                        for _ in range(limit * 50)]
    grid: list[dict[str, Any]] = []
    for config in pool:
        if config not in grid and backend.check(Candidate.of(variant, config), task) is None:
            grid.append(config)
        if len(grid) == limit:
            break
    return grid


def reference_output(task: Task, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """torch on float64 copies of the inputs: the accuracy yardstick on the GPU."""
    compute = baselines.for_task(task)
    assert compute is not None, task.kind
    return compute([t.double() for t in inputs])


def measure(backend: Backend, program: Callable[..., None], task: Task, inputs: list[list[torch.Tensor]],
            want: torch.Tensor, precision: str) -> dict[str, Any]:
    output = torch.full(task.outputs[0].shape, float("nan"), dtype=inputs[0][0].dtype, device="cuda")
    program(inputs[0], [output])
    torch.cuda.synchronize()
    check = compare(output.double().cpu().numpy(), want.cpu().numpy(), tolerance_for(precision, task))
    result: dict[str, Any] = {"rel_l2": check.get("rel_l2"), "passed": check["passed"], "reason": check["reason"]}
    if check["passed"]:
        timing = time_program(backend, program, task, MEASURE, inputs)
        result.update(ms=timing.median * 1e3, spread=timing.spread, n=len(timing.times),
                      tflops=task.flops / timing.median / 1e12)
    return result


def bench_task(backend: Backend, label: str, task: Task, limit: int, seed: int,
               only: frozenset[str] = frozenset(), subspace: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    inputs = device_inputs(backend, task, MEASURE.input_sets)
    want = reference_output(task, inputs[0])
    baseline = backend.baseline(task)
    assert baseline is not None
    rows = [{"name": "torch eager", "config": None, **measure(backend, baseline, task, inputs, want, "fp32")}]
    for variant in chosen_variants(backend, task, only):
        for config in config_grid(backend, variant, task, limit, seed, subspace):
            row: dict[str, Any] = {"name": variant.name, "precision": variant.precision, "config": config}
            try:
                artifact = backend.compile(Candidate.of(variant, config), task)
                row["resources"] = {k: artifact.meta[k] for k in ("n_regs", "n_spills", "shared")}
                row.update(measure(backend, backend.load(artifact, task), task, inputs, want, variant.precision))
            except CompileError as exc:
                row.update(passed=False, reason=f"compile error: {str(exc)[:400]}")
            except Exception as exc:  # a config that fails at run time is a result too
                row.update(passed=False, reason=f"{type(exc).__name__}: {str(exc)[:400]}")
            rows.append(row)
            print(f"  {label:44s} {variant.name:18s} {row.get('ms', float('nan')):9.4f} ms  {config}",
                  file=sys.stderr, flush=True)
    timed = [r for r in rows if "ms" in r]
    kernels = [r for r in timed if r["config"] is not None]
    best = min(kernels, key=lambda r: r["ms"], default=None)
    eager = rows[0].get("ms")
    floor = backend.target.profile.floor_seconds(task.flops, task.min_bytes, task.dtype)
    return {"op": label, "task": task.describe(), "flops": task.flops, "min_bytes": task.min_bytes,
            "floor_ms": floor * 1e3, "best": best, "eager_ms": eager,
            "speedup_vs_eager": eager / best["ms"] if best and eager else None, "rows": rows}


def environment(backend: Backend, command: Sequence[str], allow_tf32: bool) -> dict[str, Any]:
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(command), "python": platform.python_version(), "triton": triton.__version__,
            "torch_tf32": allow_tf32, "measure": MEASURE.__dict__, **backend.fingerprint()}


def summary(results: list[dict[str, Any]]) -> str:
    lines = [f"{'op':46s} {'best variant':18s} {'ms':>9s} {'TFLOP/s':>8s} {'eager ms':>9s} {'eager TF':>8s} speedup"]
    for result in results:
        best, eager_ms = result["best"], result["eager_ms"]
        eager_tf = result["flops"] / (eager_ms * 1e-3) / 1e12 if eager_ms else float("nan")
        if best is None:
            lines.append(f"{result['op']:46s} (no variant passed)  eager {eager_ms} ms")
            continue
        lines.append(f"{result['op']:46s} {best['name']:18s} {best['ms']:9.4f} {best['tflops']:8.1f} "
                     f"{eager_ms or float('nan'):9.4f} {eager_tf:8.1f} {result['speedup_vs_eager'] or 0:6.2f}x"
                     f"  {best['config']}")
    return "\n".join(lines)


def _literal(text: str) -> Any:
    """A --subspace value as the space holds it: an int, a bool, or the text."""
    if text.lstrip("-").isdigit():
        return int(text)
    return {"True": True, "False": False}.get(text, text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ops", default=DEFAULT_OPS,
                        help="kind:SIZES[:flag+flag] entries, e.g. gemm:4096x4096x1024:bias+gelu (kinds: "
                             "gemm MxNxK, bmm BxMxNxK, attention BxHxSxD, conv2d NxCxHxWxOCxKHxKW)")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--target", default="h200", help="hwprofile for constraints and the roofline floor")
    parser.add_argument("--configs", type=int, default=24, help="configs per variant (DEFAULT first)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the config sampling")
    parser.add_argument("--allow-tf32", action="store_true", help="let torch's fp32 baselines use TF32")
    parser.add_argument("--dry-run", action="store_true", help="list tasks, variants and configs; time nothing")
    parser.add_argument("--variants", default="", help="comma-separated variant names to time (default: all)")
    parser.add_argument("--subspace", default="",
                        help="sample only these values of some parameters, e.g. 'BLOCK_K=32/64;num_warps=4/8'")
    parser.add_argument("--out", type=Path, help="write the full results as JSON here (after every op)")
    args = parser.parse_args(argv)
    backend = get_backend(load_target(args.target))
    tasks = parse_ops(args.ops, args.dtype)
    only = frozenset(filter(None, args.variants.split(",")))
    subspace = {name: [_literal(v) for v in values.split("/")]
                for name, _, values in (item.partition("=") for item in args.subspace.split(";") if item)}
    if args.dry_run:
        for label, task in tasks:
            print(f"{label}: {task.flops / 1e9:.2f} GFLOP, {task.min_bytes / 1e6:.1f} MB")
            for variant in chosen_variants(backend, task, only):
                grid = config_grid(backend, variant, task, args.configs, args.seed, subspace)
                print(f"  {variant.name} ({variant.precision}): {len(grid)} configs"
                      + (f", first {grid[0]}" if grid else ""))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("grid_matrix times kernels on a GPU; use --dry-run on a CPU-only machine")
    torch.backends.cuda.matmul.allow_tf32 = args.allow_tf32
    torch.backends.cudnn.allow_tf32 = args.allow_tf32
    results = []
    for label, task in tasks:  # written after each op, so a run cut short keeps what it finished
        results.append(bench_task(backend, label, task, args.configs, args.seed, only, subspace))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            report = {"environment": environment(backend, sys.argv, args.allow_tf32), "results": results}
            args.out.write_text(json.dumps(report, indent=1, default=str))
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
