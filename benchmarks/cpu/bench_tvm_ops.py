"""TVM CPU kernels vs onnxruntime on the same subgraph, side by side in one run.

For each task (the GEMMs, attention, softmax and layernorm of a BERT/MiniLM layer at 128 tokens,
a few ResNet-50 / SqueezeNet convolutions and pools) every TVM variant is searched at random over
its space (the default first, then seeded samples that pass the constraints), each candidate
built, checked against the float64 reference and timed with the shared harness; onnxruntime runs
the task's own subgraph on the same buffers with the same harness. The headline columns (ORT ms,
TVM ms, ORT/TVM: medians; p10: 10th percentiles) come from a final duel: ORT and the best TVM
kernel timed in alternating rounds, so load from other processes on the machine hits both alike;
the search-phase times are printed beside them. GF/s is at the duel's TVM median. Prints a table
and writes JSON under benchmarks/results/.

    .venv/bin/python benchmarks/cpu/bench_tvm_ops.py --trials 24
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
from typing import Any

import numpy as np
import onnxruntime
import tvm

from portkern import synthetic
from portkern.backends import get_backend
from portkern.backends.base import Backend, Candidate, CompileError, Program, Variant
from portkern.backends.tvm.common import sample_valid
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, device_inputs, time_program
from portkern.tasks import Task
from portkern.verify import compare, make_inputs

RESULTS = Path(__file__).resolve().parents[1] / "results"


def tasks() -> dict[str, Task]:
    """A BERT/MiniLM layer at 128 tokens (hidden 384, 12 heads), ResNet-50 / SqueezeNet layers, group norms."""
    return {
        "bert qkv/out 128x384x384 +bias": synthetic.gemm_task(128, 384, 384, bias=True),
        "bert ffn1 128x1536x384 +bias gelu": synthetic.gemm_task(128, 1536, 384, bias=True, activation="gelu"),
        "bert ffn2 128x384x1536 +bias +res": synthetic.gemm_task(128, 384, 1536, bias=True, residual=True),
        "bert attention 1x12x128x64 +mask": synthetic.attention_task(1, 12, 128, 64, mask=True),
        "bert scores softmax 12x128x128": synthetic.softmax_task(12 * 128, 128),
        "bert layernorm 128x384": synthetic.layernorm_task(128, 384),
        "resnet50 1x64x56x56 3x3 64 relu": synthetic.conv2d_task(1, 64, 56, 56, 64, 3, 3, pad=1,
                                                                 activation="relu"),
        "resnet50 1x256x56x56 1x1 64 relu": synthetic.conv2d_task(1, 256, 56, 56, 64, 1, 1, activation="relu"),
        "resnet50 1x64x56x56 1x1 256 +res relu": synthetic.conv2d_task(1, 64, 56, 56, 256, 1, 1,
                                                                       activation="relu", residual=True),
        "squeezenet fire 1x16x55x55 3x3 64 relu": synthetic.conv2d_task(1, 16, 55, 55, 64, 3, 3, pad=1,
                                                                        activation="relu"),
        # wav2vec2's / HuBERT's feature extractor: a group per channel over 3199 frames; Stable
        # Diffusion's GroupNorm -> SiLU (32 groups) at a 32x32 map, PoolFormer's one group
        "wav2vec2 groupnorm 1x512x3199 g512": synthetic.groupnorm_task(1, 512, (3199,), 512),
        "sd groupnorm 1x320x32x32 g32 silu": synthetic.groupnorm_task(1, 320, (32, 32), 32, activation="silu"),
        "poolformer groupnorm 1x64x56x56 g1": synthetic.groupnorm_task(1, 64, (56, 56), 1),
        "resnet50 maxpool 1x64x112x112 3x3 s2": synthetic.pool_task(1, 64, 112, 112, "max", kernel=3, stride=2,
                                                                     pad=1),
        "resnet50 global avgpool 1x2048x7x7": synthetic.pool_task(1, 2048, 7, 7, "global_avg"),
    }


def sample_configs(backend: Backend, variant: Variant, task: Task, trials: int, seed: int) -> list[dict[str, Any]]:
    """The default, then distinct random configs that pass the constraints (never built if not)."""
    def valid(config: dict[str, Any]) -> bool:
        return config != dict(variant.default) and backend.check(Candidate.of(variant, config), task) is None

    return [dict(variant.default)] + sample_valid(variant.space, trials - 1, seed, valid)


def bench_task(backend: Backend, task: Task, trials: int, options: MeasureOptions, seed: int) -> dict[str, Any]:
    inputs = device_inputs(backend, task, options.input_sets)
    host = make_inputs(task, 101, "normal")
    reference = task.reference(host)
    baseline = backend.baseline(task)
    ort = time_program(backend, baseline, task, options, inputs) if baseline else None
    trials_out: list[dict[str, Any]] = []
    programs: dict[int, Program] = {}
    for variant in backend.variants(task):
        for config in sample_configs(backend, variant, task, trials, seed):
            record: dict[str, Any] = {"variant": variant.name, "config": config}
            try:
                artifact = backend.compile(Candidate.of(variant, config), task)
            except CompileError as exc:
                record.update(status="compile_error", reason=str(exc))
                trials_out.append(record)
                continue
            record["build_s"] = artifact.meta["compile_s"]
            program = backend.load(artifact, task)
            outputs = [backend.empty(spec, float("nan")) for spec in task.outputs]
            program([backend.to_device(a) for a in host], outputs)
            check = compare(backend.to_host(outputs[0]).astype(np.float64), reference[0], 1e-5)
            record["rel_l2"] = check.get("rel_l2")
            if not check.get("passed"):
                record.update(status="wrong", reason=json.dumps(check, default=str))
                trials_out.append(record)
                continue
            measurement = time_program(backend, program, task, options, inputs)
            record.update(status="ok", median_s=measurement.median, spread=measurement.spread)
            programs[len(trials_out)] = program
            trials_out.append(record)
    ok = [t for t in trials_out if t["status"] == "ok"]
    best = min(ok, key=lambda t: t["median_s"]) if ok else None
    duel = duel_times(backend, task, baseline, programs[trials_out.index(best)], options, inputs) \
        if best and baseline else None
    default = ok[0] if ok and ok[0]["config"] == trials_out[0]["config"] else None
    floor = backend.target.profile.floor_seconds(task.flops, task.min_bytes, task.dtype)
    return {
        "task": task.describe(), "key": task.key, "flops": task.flops, "floor_s": floor,
        "ort_s": ort.median if ort else None, "ort_spread": ort.spread if ort else None,
        "ort_method": ort.method if ort else None,
        "tvm_default_s": default["median_s"] if default else None,
        "tvm_best_s": best["median_s"] if best else None, "best": best,
        "duel": duel,
        "build_s_mean": float(np.mean([t["build_s"] for t in trials_out if "build_s" in t] or [0.0])),
        "trials": trials_out,
    }


def duel_times(backend: Backend, task: Task, baseline: Program, best: Program, options: MeasureOptions,
               inputs: list[list[Any]], rounds: int = 7) -> dict[str, float]:
    """ORT and the best TVM kernel timed in alternating rounds: on a shared machine both see the
    same interference, so their ratio is fairer than the search-phase numbers taken minutes apart.
    The 10th percentile is kept beside the median: it is what each runs at when left alone."""
    times: dict[str, list[float]] = {"ort": [], "tvm": []}
    for _ in range(rounds):
        for name, program in (("ort", baseline), ("tvm", best)):
            times[name] += time_program(backend, program, task, options, inputs).times
    return {"ort_s": float(np.median(times["ort"])), "tvm_s": float(np.median(times["tvm"])),
            "ort_p10_s": float(np.percentile(times["ort"], 10)), "tvm_p10_s": float(np.percentile(times["tvm"], 10)),
            "runs_each": len(times["ort"])}


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:8.3f}" if seconds else "     n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=24, help="configs per variant (default first)")
    parser.add_argument("--only", default="", help="run only tasks whose name contains this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    backend = get_backend(load_target("cpu"))
    options = MeasureOptions(warmup=3, repeats=30, input_sets=3, max_seconds=1.0)
    load_before = os.getloadavg()
    rows = []
    results: dict[str, Any] = {}
    for name, task in tasks().items():
        if args.only and args.only not in name:
            continue
        started = time.perf_counter()
        result = bench_task(backend, task, args.trials, options, args.seed)
        result["wall_s"] = time.perf_counter() - started
        results[name] = result
        duel = result["duel"] or {}
        ratio = duel["ort_s"] / duel["tvm_s"] if duel else None
        gflops = task.flops / duel["tvm_s"] / 1e9 if duel else 0.0
        p10_ratio = duel["ort_p10_s"] / duel["tvm_p10_s"] if duel else None
        rows.append((name, _ms(duel.get("ort_s")), _ms(duel.get("tvm_s")), f"{ratio:5.2f}x" if ratio else "  n/a",
                     _ms(duel.get("ort_p10_s")), _ms(duel.get("tvm_p10_s")),
                     f"{p10_ratio:5.2f}x" if p10_ratio else "  n/a", _ms(result["ort_s"]),
                     _ms(result["tvm_default_s"]), _ms(result["tvm_best_s"]), f"{gflops:6.1f}", _ms(result["floor_s"]),
                     f"{result['build_s_mean']:.2f}", str(len([t for t in result["trials"] if t["status"] == "ok"]))))
        print(f"{name}: ORT {_ms(result['ort_s'])} ms, TVM best {_ms(result['tvm_best_s'])} ms "
              f"({result['wall_s']:.0f} s)", file=sys.stderr, flush=True)

    header = ("task", "ORT ms", "TVM ms", "ORT/TVM", "ORT p10", "TVM p10", "p10 ratio", "search: ORT",
              "TVM default", "TVM best", "TVM GF/s", "floor ms", "build s", "ok")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))))

    now = datetime.datetime.now(datetime.timezone.utc)
    report = {
        "benchmark": "bench_tvm_ops", "date": now.isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "host": {"cpu": backend.fingerprint()["cpu"], "cores": backend.target.profile.cores,
                 "tvm_threads": tvm.runtime.num_threads(), "ort_threads": backend.target.profile.cores,
                 "machine": platform.machine(), "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                 "note": "shared 2-core machine; other engineers' tests may run at the same time"},
        "versions": {**backend.fingerprint(), "onnxruntime": onnxruntime.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "measure": {"warmup": options.warmup, "repeats": options.repeats, "input_sets": options.input_sets,
                    "ort": f"onnxruntime CPUExecutionProvider, {backend.target.profile.cores} intra-op threads, "
                           "IO binding on the same TVM buffers (no copies), same harness as TVM"},
        "trials_per_variant": args.trials, "results": results,
    }
    out = args.out or RESULTS / f"cpu_tvm_ops_{now.strftime('%Y%m%d_%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
