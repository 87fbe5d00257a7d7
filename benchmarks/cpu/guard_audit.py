"""Were the tuner's whole-model drops right? Re-times a tuned model's winners for longer than the
tuner's end-to-end check does (10 runs a side), side by side in one process.

Reads a benchmarks/models/tune_models.py result (the rows' reports carry each task's winning
variant and config, kept or dropped), rebuilds every winner that beat its baseline alone (kept or
dropped by the whole-model check), and times in alternating rounds, with a pause between runners
(onnxruntime's default session spins ~50 ms after a run):

    onnxruntime      the model in one default onnxruntime session
    pk-none          portkern with no kernel (the whole model in one onnxruntime session)
    pk-all           portkern with every winner
    pk-<task>        portkern with that winner alone

and prints each runner's median, p10/p90, its steps (one: since 2026-12-05 the kernels run inside
onnxruntime's graph) and, paired by round, its time over pk-none's.

    python benchmarks/cpu/guard_audit.py benchmarks/results/models-cpu-2026-12-04-free-workers.json \
        --model bert-mini --rounds 20
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort

from portkern.backends import get_backend
from portkern.backends.base import Backend, Candidate
from portkern.hwprofile import load_target
from portkern.ir import Graph
from portkern.models import random_feeds
from portkern.onnx_import import load_model
from portkern.pack import Pack, PackEntry
from portkern.partition import backend_tasks
from portkern.runtime import Session
from portkern.search.proposers import base_variant_name
from portkern.search.records import Measurement, Verdict
from portkern.tasks import Task

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
from tune_models import model_file, run_header  # noqa: E402


@dataclass
class Winners:
    """A tuned model's winners (kept or dropped by the whole-model check) rebuilt from a result."""

    path: Path
    graph: Graph
    backend: Backend
    tasks: list[Task]  # every occurrence, in graph order
    by_key: dict[str, Task]
    info: dict[str, dict[str, Any]]  # the tune report's row per winner
    entries: dict[str, PackEntry]


def rebuild_winners(result: str | Path, model: str) -> Winners:
    """The model file again (benchmarks/models/tune_models.py makes it the same way) and every
    winner that beat its baseline alone, built at its tuned config."""
    row = next(r for r in json.loads(Path(result).read_text())["rows"] if r["model"] == model)
    winners = {t["key"]: t for t in row["report"]["tasks"]
               if t.get("config") and (t["status"].startswith(("kept", "dropped")))}
    path, shapes = model_file(model, Path(tempfile.mkdtemp(prefix="pk-winners-")))
    backend = get_backend(load_target(row["report"]["target"]))
    graph, tasks = backend_tasks(load_model(path, shapes or None), backend)
    by_key = {t.key: t for t in tasks}
    entries: dict[str, PackEntry] = {}
    for key, info in winners.items():
        task = by_key[key]
        # a rule-derived variant (name~rules-...) is its base's source with a wider space
        variant = next(v for v in backend.variants(task) if v.name == base_variant_name(info["variant"]))
        artifact = backend.compile(Candidate.of(variant, dict(info["config"])), task)
        entries[key] = PackEntry(key=key, task=task.describe(), backend=backend.name, variant=variant.name,
                                 origin="builtin", config=dict(info["config"]), artifact=artifact,
                                 verdict=Verdict(True, "", variant.precision, {}),
                                 measurement=Measurement([info["best_seconds"]], "tuned"),
                                 baseline_seconds=info["baseline_seconds"], floor_seconds=0.0)
    return Winners(path, graph, backend, tasks, by_key, winners, entries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result")
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=8)
    parser.add_argument("--pause", type=float, default=0.15)
    parser.add_argument("--json")
    args = parser.parse_args()

    rebuilt = rebuild_winners(args.result, args.model)
    path, graph, backend, by_key, winners, entries = (rebuilt.path, rebuilt.graph, rebuilt.backend, rebuilt.by_key,
                                                      rebuilt.info, rebuilt.entries)

    def session(chosen: dict[str, PackEntry]) -> Session:
        return Session(graph, Pack(target={"name": backend.target.name, "backend": backend.name},
                                   fingerprint=backend.fingerprint(), entries=chosen), source=path)

    feeds = random_feeds(graph, seed=3)
    whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sessions = {"pk-none": session({}), "pk-all": session(entries)}
    for key in entries:
        sessions[f"pk-{by_key[key].label}"] = session({key: entries[key]})
    runners: dict[str, Callable[[], Any]] = {"onnxruntime": lambda: whole.run(None, feeds)}
    runners |= {name: (lambda s=s: s.run(feeds)) for name, s in sessions.items()}
    want = whole.run(None, feeds)[0]
    for name, s in sessions.items():
        got = s.run(feeds)[graph.outputs[0]]
        error = float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))
        assert error < 1e-3, (name, error)

    by_round: dict[str, list[float]] = {name: [] for name in runners}
    times: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(args.rounds):
        for name in (list(runners) if r % 2 == 0 else list(reversed(runners))):
            run = runners[name]
            run()
            block = []
            for _ in range(args.per_round):
                start = time.perf_counter()
                run()
                block.append(time.perf_counter() - start)
            times[name] += block
            by_round[name].append(float(np.median(block)))
            time.sleep(args.pause)

    result: dict[str, Any] = {**run_header(backend.fingerprint()), "model": args.model, "runners": {}}
    print(f"{args.model}: {len(entries)} winners; statuses from the tune:")
    for key, info in winners.items():
        print(f"  {by_key[key].label} x{info['count']}: best {info['best_seconds'] * 1e3:.3f} ms vs baseline "
              f"{info['baseline_seconds'] * 1e3:.3f} ms alone; {info['status']}")
    for name in runners:
        q = np.percentile(times[name], [10, 50, 90]) * 1e3
        paired = np.array(by_round[name]) / np.array(by_round["pk-none"])
        pq = np.percentile(paired, [25, 50, 75])
        steps = len(sessions[name].steps) if name in sessions else 1
        result["runners"][name] = {"median_ms": float(q[1]), "p10_ms": float(q[0]), "p90_ms": float(q[2]),
                                   "steps": steps, "over_pk_none_by_round": [float(v) for v in pq]}
        print(f"  {name:40s} {steps:3d} steps  median {q[1]:7.3f} ms  p10 {q[0]:7.3f}  p90 {q[2]:7.3f}  "
              f"/pk-none by round q25 {pq[0]:.3f} median {pq[1]:.3f} q75 {pq[2]:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
