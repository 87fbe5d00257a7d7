"""Grid benchmark of the Triton memory-bound variants: every variant x a grid of its configs, side by
side with torch eager and torch.compile of the same op, in one run, on the same inputs.

    python benchmarks/ops/grid_memory.py --out benchmarks/results/grid_memory_h200.json
    python benchmarks/ops/grid_memory.py --ops softmax:16384x4096,rmsnorm:4096x8192 --dtype float16
    python benchmarks/ops/grid_memory.py --dry-run     # no GPU needed: tasks, variants, configs only

Achieved bandwidth counts the task's min_bytes (every input read once, the output written once)
over the median time; triton.testing.do_bench clears L2 before each timed run. Each variant's
output is checked against torch on fp32-upcast inputs before its times count.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
import triton

from portkern.backends.base import Variant
from portkern.backends.triton import codegen
from portkern.backends.triton.modules import builtin_variants, kernel_module, scratch_specs, torch_dtype
from portkern.hwprofile import Target, load_target
from portkern.synthetic import elementwise_task, layernorm_task, reduce_task, rmsnorm_task, softmax_task
from portkern.tasks import Task

DEFAULT_OPS = "softmax:16384x4096,layernorm:16384x4096,rmsnorm:16384x4096"
BIAS_GELU = (("add", "in0", "in1"), ("gelu", "t0"))
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-5}
Torch = Callable[[Sequence[torch.Tensor]], torch.Tensor]


def _softmax(rows: int, cols: int, dtype: str) -> tuple[Task, Torch]:
    return softmax_task(rows, cols, dtype), lambda t: torch.softmax(t[0], dim=-1)


def _layernorm(rows: int, cols: int, dtype: str) -> tuple[Task, Torch]:
    return layernorm_task(rows, cols, dtype), lambda t: F.layer_norm(t[0], (cols,), t[1], t[2], 1e-5)


def _rmsnorm(rows: int, cols: int, dtype: str) -> tuple[Task, Torch]:
    return rmsnorm_task(rows, cols, dtype), lambda t: F.rms_norm(t[0], (cols,), t[1], 1e-6)


def _reduce_sum(rows: int, cols: int, dtype: str) -> tuple[Task, Torch]:
    return reduce_task((rows, cols), dtype, "sum", (-1,), False), lambda t: t[0].sum(dim=-1)


def _column_sum(rows: int, cols: int, dtype: str) -> tuple[Task, Torch]:
    """Sum over the leading axis: the strided reduction (no transpose) against torch's."""
    return reduce_task((rows, cols), dtype, "sum", (0,), False), lambda t: t[0].sum(dim=0)


def _bias_gelu(rows: int, cols: int, dtype: str) -> tuple[Task, Torch]:
    """gelu(x + y), both (rows, cols): the fused chain torch eager runs as two kernels."""
    return elementwise_task((rows, cols), dtype, BIAS_GELU), lambda t: F.gelu(t[0] + t[1])


OPS: dict[str, Callable[[int, int, str], tuple[Task, Torch]]] = {
    "softmax": _softmax, "layernorm": _layernorm, "rmsnorm": _rmsnorm, "reduce": _reduce_sum,
    "colsum": _column_sum, "elementwise": _bias_gelu}


def parse_ops(text: str, dtype: str) -> list[tuple[str, Task, Torch]]:
    """'softmax:16384x4096,rmsnorm:4096x8192' -> (label, task, torch op) per entry."""
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, shape = item.partition(":")
        if kind not in OPS:
            raise SystemExit(f"unknown op '{kind}' (one of {', '.join(OPS)})")
        try:
            rows, cols = (int(v) for v in shape.lower().split("x"))
        except ValueError:
            raise SystemExit(f"shape '{shape}' of '{item}' is not ROWSxCOLS") from None
        task, reference = OPS[kind](rows, cols, dtype)
        found.append((f"{kind} {rows}x{cols} {dtype}", task, reference))
    return found


def variants_for(task: Task) -> list[Variant]:
    return codegen.elementwise_variants(task) if task.kind == "elementwise" else \
        [v for v in builtin_variants() if v.kind == task.kind]


def config_grid(variant: Variant, task: Task, target: Target, limit: int, seed: int) -> list[dict[str, Any]]:
    """DEFAULT first, then up to limit-1 other configs its constraints accept, in a seeded order."""
    module = kernel_module(variant, interpret=False)
    every = [dict(zip(variant.space, values)) for values in itertools.product(*variant.space.values())]
    random.Random(seed).shuffle(every)
    default = dict(variant.default)
    ordered = [default] + [c for c in every if c != default]
    valid = [c for c in ordered if module.constraints(task, c, target) is None]
    return valid[:limit]


def random_inputs(task: Task, device: str) -> list[torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(0)
    return [torch.randn(spec.shape, generator=generator, device=device, dtype=torch.float32)
            .to(torch_dtype(spec.dtype)) for spec in task.inputs]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got64, want64 = got.double(), want.double()
    if not torch.isfinite(got64).all():
        return float("inf")
    return float((got64 - want64).norm() / want64.norm().clamp_min(1e-30))


def time_ms(fn: Callable[[], Any]) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def row(name: str, config: dict[str, Any] | None, ms: float | None, task: Task, **extra: Any) -> dict[str, Any]:
    tbps = task.min_bytes / (ms * 1e-3) / 1e12 if ms else None
    return {"name": name, "config": config, "ms": ms, "tb_per_s": tbps, **extra}


def bench_op(label: str, task: Task, reference: Torch, target: Target, limit: int, seed: int,
             use_compile: bool) -> dict[str, Any]:
    inputs = random_inputs(task, "cuda")
    want = reference([t.float() for t in inputs])
    output = torch.empty(task.outputs[0].shape, dtype=torch_dtype(task.outputs[0].dtype), device="cuda")
    rows = [row("torch eager", None, time_ms(lambda: reference(inputs)), task)]
    if use_compile:
        compiled = torch.compile(reference)
        compiled(inputs)
        rows.append(row("torch.compile", None, time_ms(lambda: compiled(inputs)), task))
    tolerance = TOLERANCE[task.dtype]
    for variant in variants_for(task):
        module = kernel_module(variant, interpret=False)
        for config in config_grid(variant, task, target, limit, seed):
            buffers = [output] + [torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device="cuda")
                                  for spec in scratch_specs(module, task, config)]

            def launch() -> None:
                module.launch(task, config, inputs, buffers)
            try:
                output.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                error = relative_error(output, want)
                ms = time_ms(launch) if error < tolerance else None
                rows.append(row(variant.name, config, ms, task, rel_error=error, passed=error < tolerance))
            except Exception as exc:  # a config that fails to compile or run is a result too
                rows.append(row(variant.name, config, None, task, error=f"{type(exc).__name__}: {exc}"[:500]))
            print(f"  {label:32s} {variant.name:20s} {config} {rows[-1]['ms']}", file=sys.stderr, flush=True)
    timed = [r for r in rows if r["ms"] is not None]
    kernels = [r for r in timed if r["config"] is not None]
    best = min(kernels, key=lambda r: r["ms"], default=None)
    baselines = {r["name"]: r["ms"] for r in timed if r["config"] is None}
    return {"op": label, "task": task.describe(), "min_bytes": task.min_bytes,
            "floor_ms": target.profile.floor_seconds(task.flops, task.min_bytes, task.dtype) * 1e3,
            "best": best, "speedup_vs": {name: ms / best["ms"] for name, ms in baselines.items()} if best else {},
            "rows": rows}


def environment(command: Sequence[str]) -> dict[str, Any]:
    info: dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "command": " ".join(command), "torch": torch.__version__, "triton": triton.__version__,
                            "python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        info.update(device=props.name, sms=props.multi_processor_count, cuda=torch.version.cuda,
                    driver=smi.stdout.strip() or "unknown")
    return info


def summary(results: list[dict[str, Any]]) -> str:
    lines = [f"{'op':34s} {'variant':20s} {'ms':>8s} {'TB/s':>6s}  speedup vs eager / compile"]
    for result in results:
        best = result["best"]
        if best is None:
            lines.append(f"{result['op']:34s} (no variant passed)")
            continue
        speedups = " / ".join(f"{v:.2f}x" for v in result["speedup_vs"].values())
        lines.append(f"{result['op']:34s} {best['name']:20s} {best['ms']:8.4f} {best['tb_per_s']:6.2f}  "
                     f"{speedups}  {best['config']}")
        for base in (r for r in result["rows"] if r["config"] is None):
            lines.append(f"{'':34s} {base['name']:20s} {base['ms']:8.4f} {base['tb_per_s']:6.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=DEFAULT_OPS, help=f"kind:ROWSxCOLS,... kinds: {', '.join(OPS)}")
    parser.add_argument("--dtype", default="float16", choices=sorted(TOLERANCE))
    parser.add_argument("--target", default="h200", help="hwprofile for constraints and the roofline floor")
    parser.add_argument("--configs", type=int, default=32, help="configs per variant (DEFAULT first)")
    parser.add_argument("--seed", type=int, default=0, help="order in which the config grid is sampled")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--dry-run", action="store_true", help="list tasks, variants and configs; time nothing")
    parser.add_argument("--out", type=Path, help="write the full results as JSON here")
    args = parser.parse_args(argv)
    target = load_target(args.target)
    ops = parse_ops(args.ops, args.dtype)
    if args.dry_run:
        for label, task, _ in ops:
            for variant in variants_for(task):
                configs = config_grid(variant, task, target, args.configs, args.seed)
                print(f"{label}: {variant.name}: {len(configs)} configs")
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("no GPU here: run on the GPU machine, or use --dry-run")
    results = [bench_op(label, task, reference, target, args.configs, args.seed, not args.no_compile)
               for label, task, reference in ops]
    report = {"environment": environment(sys.argv if argv is None else ["grid_memory.py", *argv]),
              "target": args.target, "results": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))
    print(summary(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
