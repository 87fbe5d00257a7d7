"""What a kept TVM kernel costs a whole model on the CPU, split from what it gains.

Builds the `make demo` BERT (2 layers, hidden 256, seq 128), compiles the chosen tasks' TVM
kernels at their variant's default config (no search: the point is the split, not the kernel),
and times in alternating rounds, one process, same feeds:

    onnxruntime   the model file in one onnxruntime session (its default options)
    pk-none       portkern with an empty pack (the whole model in one onnxruntime session)
    pk-split-ort  portkern with the pack's split, each kernel replaced by onnxruntime on the
                  kernel's own subgraph (the split's cost alone)
    pk-split-tvm  portkern with the TVM kernels (the split's cost plus the kernels' gain)
    pk-inline-tvm the TVM kernels inside onnxruntime's graph, one session (backends/tvm/inline.py:
                  the runtime's way since 2026-12-05; the split runners force the old one)

and then each step of the split runs alone (median per step), so a slow step after a kernel
shows. Each configuration can run in a fresh process with other environment
(TVM reads TVM_THREAD_POOL_SPIN_COUNT once, when its pool starts).

    python benchmarks/cpu/split_cost_probe.py --tasks layernorm,gemm[1x256 --rounds 7

--shared-pool adds the same runners ("... shared") with every onnxruntime session on one
process-wide intra-op pool (set_global_thread_pool_sizes + use_per_session_threads=False), made
after the per-session ones: onnxruntime 1.32 refuses a session with its own pool once that pool
exists, and ignores session.force_spinning_stop on it (its worker spins ~20 ms after every run).
Measured 2026-12-04 (2-core EPYC VM, one thread a core, default tasks: 6 cuts, 12 steps), medians
of 15-20 rounds x 20 runs, p10-p90 about 3.3-7 ms throughout; a cut: (split - pk-none) / 6 on the
same pool:

  TVM_THREAD_POOL_SPIN_COUNT=128 (portkern's), 4 runs:
    pk-split-ort 4.89-5.51 ms, 173-228 us a cut; shared 4.74-4.97, 117-155 us a cut (and so in 7
    ad hoc runs in both runner orders; a harness that re-made TVM's pool before each block saw none)
    pk-split-tvm 4.58-4.85; shared 24.0 in every run: TVM's worker, pinned to a core, waits out the
    spinning onnxruntime worker, a guess: one 4 ms tick (CONFIG_HZ=250) for each of the 6 kernels
  TVM_THREAD_POOL_SPIN_COUNT=0, 2 runs here and 5 in an ad hoc copy (both runner orders):
    pk-split-tvm 4.49-5.19 vs shared 3.87-5.32: shared faster in 6 of 7 (own - shared: -0.13 to +0.65 ms,
    median +0.27); 160-185 vs 49-94 us a cut in the two runs here

Not in the runtime (yet): with TVM kernels the gain is ~0.3 ms on this model, not in every run, and
needs TVM's spin count at 0; and the pool is process-wide for good: onnxruntime then refuses every
session with its own pool (a user's, the benchmarks' onnxruntime reference) and its worker spins
~20 ms after each run whatever force_spinning_stop says. That worker at SCHED_IDLE (ad hoc) made
TVM kernels slower still at spin 128 (6.1-7.0 ms vs 3.9-4.7 on per-session pools).
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
from unittest import mock

import numpy as np
import onnxruntime as ort

from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.backends.tvm import TvmBackend
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


def shared_pool_sessions(path: Path, cores: int) -> ort.InferenceSession:
    """From now on every onnxruntime session of this process runs on one process-wide intra-op pool
    of `cores` threads (portkern's too); the whole model in such a session. onnxruntime refuses
    sessions with pools of their own once the process-wide pool exists."""
    from onnxruntime.capi import _pybind_state

    import portkern.ort_subgraph as ort_subgraph

    _pybind_state.set_global_thread_pool_sizes(cores, 1)
    per_session = ort_subgraph.session_options

    def on_shared_pool(threads: int, stop_spinning: bool = True) -> Any:
        options = per_session(threads, stop_spinning)
        options.use_per_session_threads = False
        options.intra_op_num_threads = options.inter_op_num_threads = 0  # else a warning per session
        return options
    ort_subgraph.session_options = on_shared_pool
    options = ort.SessionOptions()
    options.use_per_session_threads = False
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


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
    parser.add_argument("--shared-pool", action="store_true",
                        help="also time everything with onnxruntime's sessions on one process-wide pool")
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

    def session(with_entries: dict[str, PackEntry], inline: bool = False) -> Session:
        """inline: the kernels inside onnxruntime's graph (the runtime's way since 2026-12-05);
        otherwise the split this probe was written for (kernels as steps between sessions)."""
        pack = Pack(target={"name": "cpu", "backend": "tvm"}, fingerprint=backend.fingerprint(), entries=with_entries)
        if inline:
            return Session(graph, pack, source=path)
        with mock.patch.object(TvmBackend, "graph_runner", lambda *args, **kwargs: None):
            return Session(graph, pack, source=path)

    def sessions(suffix: str) -> dict[str, Session]:
        none, split_tvm, split_ort = session({}), session(entries), session(entries)
        inline_tvm = session(entries, inline=True)
        for bound in split_ort.kernels:  # the same split, onnxruntime in each kernel's place
            baseline = backend.baseline(bound.task)
            assert baseline is not None
            bound.program = baseline
        split_ort.steps = split_ort._ordered_steps()
        return {f"pk-none{suffix}": none, f"pk-split-ort{suffix}": split_ort, f"pk-split-tvm{suffix}": split_tvm,
                f"pk-inline-tvm{suffix}": inline_tvm}

    feeds = random_feeds(graph, seed=3)
    whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ours = sessions("")
    runners: dict[str, Callable[[], Any]] = {"onnxruntime": lambda: whole.run(None, feeds)}
    if args.shared_pool:  # after every per-session pool exists: none can be made once this is set
        whole_shared = shared_pool_sessions(path, backend.target.profile.cores)
        ours |= sessions(" shared")
        runners["onnxruntime shared"] = lambda: whole_shared.run(None, feeds)
    want = whole.run(None, feeds)[0]
    for name, s in ours.items():
        got = s.run(feeds)[graph.outputs[0]]
        error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        print(f"{name}: {len(s.steps)} steps, rel error vs onnxruntime {error:.2g}", file=sys.stderr)

    runners |= {name: (lambda s=s: s.run(feeds)) for name, s in ours.items()}
    times = interleave(runners, args.rounds, args.per_round, args.pause)
    result: dict[str, Any] = {"kernels": [t.label for t in chosen.values()],
                              "runners": {name: summary(t) for name, t in times.items()}}
    base = result["runners"]["onnxruntime"]["median_ms"]
    for name, row in result["runners"].items():
        print(f"{name:14s} median {row['median_ms']:7.3f} ms  p10 {row['p10_ms']:7.3f}  p90 {row['p90_ms']:7.3f}  "
              f"x{row['median_ms'] / base:.3f} of onnxruntime")
    if args.steps:
        for name, s in ours.items():
            if name.startswith("pk-none"):
                continue
            result[f"steps {name}"] = [(label, t * 1e3) for label, t in step_times(s, feeds, 50)]
            print(f"steps of {name}:")
            for label, ms in result[f"steps {name}"]:
                print(f"  {ms:7.3f} ms  {label}")
    if args.json:  # the machine, versions, date and command first, as every result file here
        sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
        from tune_models import run_header

        Path(args.json).write_text(json.dumps({**run_header(backend.fingerprint()), **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
