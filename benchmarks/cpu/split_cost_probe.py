"""What a kept TVM kernel costs a whole model on the CPU, split from what it gains.

Builds the `make demo` BERT (2 layers, hidden 256, seq 128), compiles the chosen tasks' TVM
kernels at their variant's default config (no search: the point is the split, not the kernel),
and times in alternating rounds, one process, same feeds:

    onnxruntime   the model file in one onnxruntime session (its default options)
    pk-none       portkern with an empty pack (the whole model in one onnxruntime session)
    pk-split-ort  portkern with the pack's split, each kernel replaced by onnxruntime on the
                  kernel's own subgraph (the split's cost alone)
    pk-split-tvm  portkern with the TVM kernels (the split's cost plus the kernels' gain)

and then each step of the pk-split-tvm and pk-split-ort runs alone (median per step), so a slow
step after a kernel shows. Each configuration can run in a fresh process with other environment
(TVM reads TVM_THREAD_POOL_SPIN_COUNT once, when its pool starts).

    python benchmarks/cpu/split_cost_probe.py --tasks layernorm,gemm[1x256 --rounds 7
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort

from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.hwprofile import load_target
from portkern.models import export_bert, random_feeds
from portkern.onnx_import import load_model
from portkern.pack import Pack, PackEntry
from portkern.partition import backend_tasks
from portkern.runtime import Session
from portkern.search.records import Measurement, Verdict
from portkern.tasks import Task

DEMO = dict(layers=2, hidden=256, heads=4, intermediate=1024, seq=128)


def default_entry(backend: Any, task: Task) -> PackEntry:
    """The task's first TVM variant at its default config, compiled, as a pack entry (not tuned)."""
    variant = backend.variants(task)[0]
    candidate = Candidate.of(variant, dict(variant.default))
    artifact = backend.compile(candidate, task)
    return PackEntry(key=task.key, task=task.describe(), backend=backend.name, variant=variant.name,
                     origin="builtin", config=dict(variant.default), artifact=artifact,
                     verdict=Verdict(True, "", variant.precision, {}), measurement=Measurement([1e-3], "probe"),
                     baseline_seconds=None, floor_seconds=0.0)


def interleave(runners: dict[str, Callable[[], Any]], rounds: int, per_round: int,
               pause_s: float) -> dict[str, list[float]]:
    """Seconds per run of each runner, in alternating rounds after a warm-up run each."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            run()
            for _ in range(per_round):
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
            time.sleep(pause_s)
    return times


def step_times(session: Session, feeds: dict[str, np.ndarray], runs: int) -> list[tuple[str, float]]:
    """Median seconds of each step of a run, steps timed one by one in whole runs."""
    per_step: list[list[float]] = [[] for _ in session.steps]
    for _ in range(runs):
        values: dict[str, Any] = {name: np.asarray(value) for name, value in feeds.items()}
        for i, step in enumerate(session.steps):
            start = time.perf_counter()
            step.run(values)
            per_step[i].append(time.perf_counter() - start)
    return [(step.label, statistics.median(t)) for step, t in zip(session.steps, per_step)]


def summary(values: list[float]) -> dict[str, float]:
    q = np.percentile(values, [10, 50, 90])
    return {"median_ms": q[1] * 1e3, "p10_ms": q[0] * 1e3, "p90_ms": q[2] * 1e3, "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="layernorm,gemm[1x256",
                        help="comma-separated prefixes of task labels to run on TVM kernels")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--steps", action="store_true", help="also time each step of the split runs")
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="pk-split-probe-"))
    path = export_bert(folder, **DEMO)
    backend = get_backend(load_target("cpu"))
    graph, tasks = backend_tasks(load_model(path, {"input_ids": (1, DEMO["seq"])}), backend)
    prefixes = args.tasks.split(",")
    chosen = {t.key: t for t in tasks if any(t.label.startswith(p) for p in prefixes) and backend.variants(t)}
    entries = {key: default_entry(backend, task) for key, task in chosen.items()}
    print(f"TVM kernels: {', '.join(t.label for t in chosen.values())}", file=sys.stderr)

    def session(with_entries: dict[str, PackEntry]) -> Session:
        pack = Pack(target={"name": "cpu", "backend": "tvm"}, fingerprint=backend.fingerprint(), entries=with_entries)
        return Session(graph, pack, source=path)

    none, split_tvm, split_ort = session({}), session(entries), session(entries)
    for bound in split_ort.kernels:  # the same split, onnxruntime in each kernel's place
        baseline = backend.baseline(bound.task)
        assert baseline is not None
        bound.program = baseline
    split_ort.steps = split_ort._ordered_steps()
    feeds = random_feeds(graph, seed=3)
    whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = whole.run(None, feeds)[0]
    for name, s in (("pk-split-tvm", split_tvm), ("pk-split-ort", split_ort)):
        got = s.run(feeds)[graph.outputs[0]]
        error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        print(f"{name}: {len(s.steps)} steps, rel error vs onnxruntime {error:.2g}", file=sys.stderr)

    runners = {"onnxruntime": lambda: whole.run(None, feeds), "pk-none": lambda: none.run(feeds),
               "pk-split-ort": lambda: split_ort.run(feeds), "pk-split-tvm": lambda: split_tvm.run(feeds)}
    times = interleave(runners, args.rounds, args.per_round, args.pause)
    result: dict[str, Any] = {"kernels": [t.label for t in chosen.values()],
                              "runners": {name: summary(t) for name, t in times.items()}}
    base = result["runners"]["onnxruntime"]["median_ms"]
    for name, row in result["runners"].items():
        print(f"{name:14s} median {row['median_ms']:7.3f} ms  p10 {row['p10_ms']:7.3f}  p90 {row['p90_ms']:7.3f}  "
              f"x{row['median_ms'] / base:.3f} of onnxruntime")
    if args.steps:
        for name, s in (("pk-split-ort", split_ort), ("pk-split-tvm", split_tvm)):
            result[f"steps {name}"] = [(label, t * 1e3) for label, t in step_times(s, feeds, 50)]
            print(f"steps of {name}:")
            for label, ms in result[f"steps {name}"]:
                print(f"  {ms:7.3f} ms  {label}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
