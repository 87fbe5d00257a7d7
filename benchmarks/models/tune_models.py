"""Whole models: tune each for a target within a time budget, then time `portkern run` with the
pack against onnxruntime (CPU) side by side in alternating blocks, same inputs, same process.

    python benchmarks/models/tune_models.py --target cpu --models bert-mini,squeezenet,shufflenet,resnet50 \
        --time-budget 150 --out benchmarks/results/models-cpu.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import portkern
from portkern.models import export_bert, random_feeds, randomize_weights, zoo_model_path

BERTS = {  # name -> export_bert arguments (random init; shapes of real small encoders)
    "bert-mini": dict(layers=2, hidden=256, heads=4, intermediate=1024, seq=128),
    "minilm-l6": dict(layers=6, hidden=384, heads=12, intermediate=1536, seq=128),
}


def run_header(fingerprint: dict[str, str]) -> dict[str, Any]:
    """When, how and on what a CPU result was measured: the head of every result file here."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "command": " ".join(sys.argv),
            "device": {"host": platform.node(), "cpu": platform.processor() or platform.machine(), **fingerprint},
            "onnxruntime": ort.__version__}


def model_file(name: str, folder: Path) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """A BERT of BERTS, a light zoo model with seeded random weights, or any ONNX file (as it is)."""
    if name.endswith(".onnx"):
        return Path(name), {}
    if name in BERTS:
        return export_bert(folder, **BERTS[name]), {"input_ids": (1, BERTS[name]["seq"])}
    path = folder / f"{name}.onnx"
    onnx.save(randomize_weights(onnx.load(str(zoo_model_path(name))), seed=0), str(path))
    return path, {}


def block_latency(session: portkern.Session, ort_session: Any, feeds: dict[str, np.ndarray],
                  rounds: int, blocks: int = 3) -> tuple[list[float], list[float]]:
    """Alternating blocks of runs with a pause between: onnxruntime's pool threads spin after a
    run (its default), which would steal a 2-core host from whichever runner goes next."""
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(blocks):
        for run, times in ((lambda: session.run(feeds), ours), (lambda: ort_session.run(None, feeds), theirs)):
            run()
            for _ in range(rounds):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            time.sleep(0.2)
    return ours, theirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--models", default="bert-mini,squeezenet,shufflenet,resnet50",
                        help="names (BERTS, the light zoo) or .onnx files, comma-separated")
    parser.add_argument("--time-budget", type=float, default=150.0)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default="models.json")
    parser.add_argument("--keep", help="keep the models and packs in this folder (default: a temporary one, removed)")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pk-models-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        path, shapes = model_file(name, work)
        name = path.stem if name.endswith(".onnx") else name
        pack = work / f"{name}.pkpack"
        report = portkern.tune(path, target=args.target, shapes=shapes, out=pack, trials=args.trials,
                               time_budget_s=args.time_budget, per_task_trials=24)
        session = portkern.Session(path, pack)
        feeds = random_feeds(session.graph, seed=3)
        ort_session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        ours, theirs = block_latency(session, ort_session, feeds, args.rounds)
        want = ort_session.run(None, feeds)
        got = session.run(feeds)
        error = max(float(np.linalg.norm(got[o.name] - w) / (np.linalg.norm(w) or 1.0))
                    for o, w in zip(ort_session.get_outputs(), want))
        row = {"model": name, "shapes": {k: list(v) for k, v in shapes.items()},
               "tuning_wall_seconds": report.wall_seconds, "kernels_in_pack": len(session.kernels),
               "tasks": len(session.tasks), "fallback_tasks": len(session.fallbacks),
               "portkern_seconds": statistics.median(ours), "onnxruntime_seconds": statistics.median(theirs),
               "ratio_portkern_over_onnxruntime": statistics.median(ours) / statistics.median(theirs),
               "rel_l2_vs_onnxruntime": error, "report": report.to_dict()}
        rows.append(row)
        print(f"{name:12s} tuned in {report.wall_seconds:5.0f} s, {len(session.kernels)}/{len(session.tasks)} tasks "
              f"on pack kernels | portkern {row['portkern_seconds'] * 1e3:.2f} ms vs onnxruntime "
              f"{row['onnxruntime_seconds'] * 1e3:.2f} ms = {row['ratio_portkern_over_onnxruntime']:.2f}x | "
              f"rel err {error:.1e}", flush=True)
        Path(args.out).write_text(json.dumps({
            "benchmark": "whole-model latency with a tuned pack vs onnxruntime (CPU provider)",
            **run_header(report.fingerprint),
            "method": f"median of 3 alternating blocks of {args.rounds} runs each (0.2 s pause between), "
                      "portkern and onnxruntime in one process, same feeds",
            "rows": rows}, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [r["ratio_portkern_over_onnxruntime"] for r in rows]
    print(f"geomean portkern/onnxruntime latency: {float(np.exp(np.mean(np.log(ratios)))):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
