"""Where TVM's pool worker and the calling thread run, and what it costs a kernel and a split model.

TVM 0.27's pool (src/runtime/thread_pool.cc, threading_backend.cc): the calling thread runs task 0
of a parallel loop itself and `cores - 1` workers run the rest; runtime.config_threadpool with
affinity mode -2 pins worker i to the (i+1)-th listed CPU and gives the calling thread all listed
CPUs; TVM_BIND_THREADS=0 makes it set no affinity at all (the workers keep the creating thread's).
On the 2-core host the one worker is pinned to CPU 1 while the caller floats: when the caller is
on CPU 1 too, the woken worker waits for it.

This probe switches the placement in one process, by setting the affinity of TVM's worker (found
as the thread the first config_threadpool starts) and of the calling thread, and times, in
alternating rounds, each placement:

    pinned    worker on the 2nd CPU, caller free (portkern's _use_cores until 2026-12-04)
    unbound   worker and caller free (what TVM_BIND_THREADS=0 gives)
    worker0   worker on the 1st CPU, caller free
    caller0   worker on the 2nd CPU, caller on the 1st (a reference: not adoptable, since threads
              the caller starts later, onnxruntime's pools among them, inherit its affinity)

on kernels (a BERT-mini LayerNorm and GEMM, a ResNet conv; default configs) called back to back
("hot": the worker still spinning), after 0.3 ms of the caller's own work ("cold": the worker
asleep, as after an onnxruntime stretch), and on the split demo BERT of split_cost_probe.py
(LayerNorms and the 1x256 GEMMs on TVM) with onnxruntime and the unsplit session beside it.

    python benchmarks/cpu/pool_affinity_probe.py --rounds 9
    python benchmarks/cpu/pool_affinity_probe.py --no-model --hog 1 --placements pinned,unbound,worker0

Measured 2026-12-04 on the 2-core EPYC VM (one thread a core), default configs, medians (p10, p90)
in ms; "paired" is the median over rounds of (the placement's round median / pinned's):

  no hog (--rounds 30/40, 4 placements; another session's work shared the host, the model ran
  at 1-3x its quiet 3.4 ms):
    LayerNorm hot:  pinned 0.012, unbound 0.009-0.013, worker0 0.013, caller0 0.007-0.008 (the
                    co-location lead: caller and spinning worker on one CPU)
    LayerNorm cold: pinned 0.025, unbound 0.020-0.036, worker0 0.016-0.020, caller0 0.030-0.039
                    (p10 0.023-0.029 vs 0.014: waking a sleeping worker on the other vCPU costs
                    ~15 us; with the caller on the worker's CPU the wake is local)
    LayerNorm serial (parallel=False): 0.009 hot, 0.010 cold, whatever the placement
    GEMM 128x1024x256 and conv 64x56x56 3x3: all placements within noise (paired 0.99-1.07)
    split BERT (pk-split-tvm): paired unbound/pinned 0.99-1.15, too noisy to tell
  a busy-looping process pinned to CPU 1 (--hog 1, 12 rounds):
    LayerNorm cold: pinned 3.72 (3.60, 7.74), unbound 0.037 (0.015, 7.69), worker0 0.021 (0.014, 0.061)
    GEMM cold:      pinned 7.69 (3.69, 11.7), unbound 3.70 (0.69, 11.4),  worker0 0.74 (0.69, 4.85)
    conv cold:      pinned 13.0 (8.70, 19.7), unbound 7.16 (2.65, 17.8),  worker0 2.95 (2.61, 7.24)
    (TVM hands task 1 to its worker and waits for it: a worker pinned beside a busy thread waits a
    scheduler slice each time. onnxruntime's default session pins its worker to CPU 1 too, yet beside
    the same hog it ran squeezenet as fast as a session with a free worker, paired 0.985: a guess,
    its caller takes the work a late worker has not started)
  the host loaded by other work (two runs, pinned vs unbound, 40 rounds): unbound paired 0.85-0.99
    on every kernel (GEMM cold median 0.90 vs 1.62, conv hot p90 12.0 vs 18.7), split BERT 0.96.

So portkern's _use_cores leaves the workers free (config_threadpool mode -3); caller0 wins only
back to back, and cannot be adopted (threads the caller starts inherit its affinity).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def task_affinities() -> dict[int, str]:
    """Cpus_allowed_list of every thread of this process."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            status = Path(f"/proc/self/task/{tid}/status").read_text()
        except OSError:
            continue
        found[int(tid)] = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                               if line.startswith("Cpus_allowed_list"))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=40, help="kernel calls per placement per round")
    parser.add_argument("--per-round", type=int, default=10, help="model runs per placement per round")
    parser.add_argument("--placements", default="pinned,unbound,worker0,caller0")
    parser.add_argument("--pause", type=float, default=0.1, help="seconds between blocks")
    parser.add_argument("--no-model", action="store_true")
    parser.add_argument("--hog", type=int, help="a busy-looping process pinned to this CPU throughout (a pool "
                                                "thread of someone else's spinning there)")
    parser.add_argument("--json")
    args = parser.parse_args()

    if args.hog is not None:
        import subprocess
        hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{args.hog}}})\n"
                                "while True: pass"])
    import tvm  # noqa: F401  (its own threads start at import)
    before = set(task_affinities())
    from portkern import synthetic
    from portkern.backends import get_backend
    from portkern.backends.base import Candidate
    from portkern.hwprofile import load_target
    from portkern.verify import make_inputs

    backend = get_backend(load_target("cpu"))
    workers = sorted(set(task_affinities()) - before)
    main_tid = os.getpid()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"TVM workers {workers}: {task_affinities()}", file=sys.stderr)
    everywhere = set(cpus)
    placements: dict[str, tuple[set[int], set[int]]] = {  # name: (workers' CPUs, caller's CPUs)
        "pinned": ({cpus[1]}, everywhere), "unbound": (everywhere, everywhere),
        "worker0": ({cpus[0]}, everywhere), "caller0": ({cpus[1]}, {cpus[0]})}
    chosen = {name: placements[name] for name in args.placements.split(",")}

    def place(name: str) -> None:
        worker_cpus, caller_cpus = chosen[name]
        for tid in workers:
            os.sched_setaffinity(tid, worker_cpus)
        os.sched_setaffinity(main_tid, caller_cpus)

    kernels = {"layernorm 128x256": synthetic.layernorm_task(128, 256),
               "gemm 128x1024x256 bias": synthetic.gemm_task(128, 1024, 256, bias=True),
               "conv 64x56x56 3x3": synthetic.conv2d_task(1, 64, 56, 56, 64, 3, 3, pad=1)}
    serial = {f"{label} serial": task for label, task in kernels.items() if not label.startswith("conv")}
    programs: dict[str, Callable[[], None]] = {}
    for label, task in {**kernels, **serial}.items():
        variant = backend.variants(task)[0]
        config = dict(variant.default, parallel=not label.endswith("serial"))
        program = backend.load(backend.compile(Candidate.of(variant, config), task), task)
        inputs = [backend.to_device(a) for a in make_inputs(task, 1, "normal")]
        outputs = [backend.empty(spec, 0.0) for spec in task.outputs]
        programs[label] = lambda p=program, i=inputs, o=outputs: p(i, o)

    def busy(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    model_runners: dict[str, Callable[[], Any]] = {}
    if not args.no_model:
        sys.path.insert(0, str(Path(__file__).parent))
        import onnxruntime as ort
        from split_cost_probe import DEMO, default_entry

        from portkern.models import export_bert, random_feeds
        from portkern.onnx_import import load_model
        from portkern.pack import Pack
        from portkern.partition import backend_tasks
        from portkern.runtime import Session

        path = export_bert(Path(tempfile.mkdtemp(prefix="pk-affinity-probe-")), **DEMO)
        graph, tasks = backend_tasks(load_model(path, {"input_ids": (1, DEMO["seq"])}), backend)
        picked = {t.key: t for t in tasks if t.label.startswith(("layernorm", "gemm[1x256")) and backend.variants(t)}
        entries = {key: default_entry(backend, task) for key, task in picked.items()}
        fingerprint = backend.fingerprint()
        split = Session(graph, Pack(target={"name": "cpu", "backend": "tvm"}, fingerprint=fingerprint,
                                    entries=entries), source=path)
        none = Session(graph, Pack(target={"name": "cpu", "backend": "tvm"}, fingerprint=fingerprint,
                                   entries={}), source=path)
        whole = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = random_feeds(graph, seed=3)
        print(f"model: {len(picked)} TVM kernels, {len(split.steps)} steps; threads {task_affinities()}",
              file=sys.stderr)
        model_runners = {"onnxruntime": lambda: whole.run(None, feeds), "pk-none": lambda: none.run(feeds),
                         "pk-split-tvm": lambda: split.run(feeds)}

    times: dict[str, list[float]] = {}
    by_round: dict[str, list[list[float]]] = {}  # key: per round, its times

    def record(key: str, seconds: float) -> None:
        times.setdefault(key, []).append(seconds)
        rounds = by_round.setdefault(key, [])
        while len(rounds) <= r:
            rounds.append([])
        rounds[r].append(seconds)

    def timed(run: Callable[[], object], key: str, calls: int, before: Callable[[], object] | None = None) -> None:
        """`calls` timed runs of `run` into `key`, each after `before` (untimed) if given."""
        for _ in range(calls):
            if before is not None:
                before()
            start = time.perf_counter()
            run()
            record(key, time.perf_counter() - start)

    for r in range(args.rounds):
        order = list(chosen) if r % 2 == 0 else list(reversed(chosen))
        for name in order:
            place(name)
            for label, run in programs.items():
                run()
                timed(run, f"{label} hot|{name}", args.calls)
                timed(run, f"{label} cold|{name}", args.calls // 2, lambda: busy(3e-4))
            for label, run in model_runners.items():
                run()
                timed(run, f"{label}|{name}", args.per_round)
                time.sleep(args.pause)  # a default onnxruntime session's worker spins ~50 ms after a run
            time.sleep(args.pause)
    place("unbound")
    if args.hog is not None:
        hog.kill()

    result: dict[str, Any] = {}
    for key, values in times.items():
        q = [float(v) for v in np.percentile(values, [10, 50, 90]) * 1e3]
        result[key] = {"p10_ms": round(q[0], 4), "median_ms": round(q[1], 4), "p90_ms": round(q[2], 4),
                       "n": len(values)}
    # paired by round: the median over rounds of (this placement's round median / pinned's)
    for key, rounds in by_round.items():
        what, name = key.split("|")
        ref = by_round.get(f"{what}|pinned")
        if ref is None or name == "pinned":
            continue
        ratios = [np.median(a) / np.median(b) for a, b in zip(rounds, ref) if a and b]
        q = np.percentile(ratios, [25, 50, 75])
        result[key]["vs_pinned_by_round"] = {"q25": round(float(q[0]), 3), "median": round(float(q[1]), 3),
                                             "q75": round(float(q[2]), 3)}
    last = None
    for key in sorted(result, key=lambda k: (k.split("|")[0], list(chosen).index(k.split("|")[1])
                                              if k.split("|")[1] in chosen else -1)):
        what, name = key.split("|")
        if what != last:
            print(what)
            last = what
        row = result[key]
        paired = row.get("vs_pinned_by_round")
        print(f"   {name:8s} median {row['median_ms']:8.4f} ms  p10 {row['p10_ms']:8.4f}  p90 {row['p90_ms']:8.4f}"
              f"  n {row['n']}" + (f"  vs pinned by round (q25 median q75) {paired['q25']} {paired['median']} "
                                   f"{paired['q75']}" if paired else ""))
    if args.json:
        sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
        from tune_models import run_header

        Path(args.json).write_text(json.dumps({**run_header(backend.fingerprint()), "times": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
