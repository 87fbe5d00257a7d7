"""The `portkern` command. A user mistake is one line on stderr and exit code 2, never a traceback."""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .errors import PortkernError


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an ONNX model file")
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=AxB",
                        help="bind an input's dynamic dims, e.g. --shape input_ids=1x128 (repeatable)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portkern", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    targets = sub.add_parser("targets", help="list the hardware targets and their profiles")
    targets.add_argument("--json", action="store_true")

    inspect = sub.add_parser("inspect", help="a model's kernel tasks with FLOPs, bytes and roofline floor; or a pack")
    inspect.add_argument("model", help="an ONNX model or a kernel pack")
    inspect.add_argument("--shape", action="append", default=[], metavar="NAME=AxB")
    inspect.add_argument("--target", default="h200")
    inspect.add_argument("--json", action="store_true")

    profile = sub.add_parser("profile", help="time every task with the baseline on the target")
    _add_model_args(profile)
    profile.add_argument("--target", required=True)
    profile.add_argument("--backend")
    profile.add_argument("--trace", metavar="OUT.json", help="write a Chrome/Perfetto trace")
    profile.add_argument("--json", action="store_true")

    tune = sub.add_parser("tune", help="tune verified kernels for a model and write a kernel pack")
    _add_model_args(tune)
    tune.add_argument("--target", required=True)
    tune.add_argument("--backend", help="override the target's default backend")
    tune.add_argument("-o", "--out", required=True, help="the pack to write (a directory, or .tar.gz)")
    tune.add_argument("--trials", type=int, default=200, help="measured trials across all tasks")
    tune.add_argument("--per-task-trials", type=int, default=48)
    tune.add_argument("--time-budget", type=float, metavar="SECONDS")
    tune.add_argument("--max-tasks", type=int, help="tune only the N tasks with the most headroom")
    tune.add_argument("--storage", help="Optuna storage URL (default: SQLite in the work dir); "
                                        "postgresql://... for distributed runs")
    tune.add_argument("--work-dir", help="records, study and artifacts (default: OUT.work)")
    tune.add_argument("--resume", action="store_true", help="continue the tune in the work dir")
    tune.add_argument("--proposer", action="append", choices=["builtin", "rules", "llm"],
                      help="where candidates come from (default: builtin + rules; + llm with an endpoint)")
    tune.add_argument("--llm-endpoint", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    tune.add_argument("--llm-model")
    tune.add_argument("--llm-max-requests", type=int, default=32, help="HTTP requests per tune (retries count)")
    tune.add_argument("--llm-max-tokens", type=int, default=400_000, help="tokens per tune")
    tune.add_argument("--llm-timeout", type=float, default=120.0, help="seconds per request")
    tune.add_argument("--trial-timeout", type=float, default=300.0,
                      help="seconds a trial may take: compile, gate and timing (default 300)")
    tune.add_argument("--kernel-timeout", type=float, default=60.0,
                      help="seconds a trial's kernel runs (gate and timing) may take before the kernel is killed "
                           "as hung; 0: the trial limit only (default 60; not applied to interpreted kernels)")
    tune.add_argument("--compile-workers", type=int, default=0,
                      help="processes that compile candidates ahead of the measuring worker (they launch nothing)")
    tune.add_argument("--allow-tf32", action="store_true",
                      help="float32 tasks may take kernels that multiply in TF32 (verified at TF32 tolerances; "
                           "the baselines they are compared with stay IEEE float32). Without it they still get "
                           "tensor cores through tf32x3 kernels, which keep float32 accuracy")
    tune.add_argument("--skip-variant", action="append", default=[], metavar="NAME",
                      help="leave this built-in variant (and what the rules derive from it) out of the search; "
                           "repeatable (a name no task is offered is reported with those that are)")
    tune.add_argument("--no-priors", action="store_true",
                      help="do not seed studies with the configurations the target's priors file measured best")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--json", action="store_true", help="print the report as JSON")
    tune.add_argument("--quiet", action="store_true", help="no progress lines")

    run = sub.add_parser("run", help="run a model with a kernel pack")
    _add_model_args(run)
    run.add_argument("--pack", help="the kernel pack (omit to run the reference executor)")
    run.add_argument("--allow-mismatch", action="store_true",
                     help="use a pack from other hardware/software after re-verifying every kernel")
    run.add_argument("--inputs", help="an .npz of inputs (default: seeded random inputs)")
    run.add_argument("--save", help="write the outputs to this .npz")
    run.add_argument("--json", action="store_true")

    bench = sub.add_parser("bench", help="whole-model latency: pack vs onnxruntime vs reference executor")
    _add_model_args(bench)
    bench.add_argument("--pack")
    bench.add_argument("--allow-mismatch", action="store_true")
    bench.add_argument("--repeats", type=int, default=10)
    bench.add_argument("--json", action="store_true")

    pack = sub.add_parser("pack", help="kernel pack tools")
    pack_sub = pack.add_subparsers(dest="pack_command", required=True)
    merge = pack_sub.add_parser("merge", help="merge packs (several shapes/models, one target)")
    merge.add_argument("out")
    merge.add_argument("packs", nargs="+")
    return parser


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4g} ms"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def cmd_targets(args: argparse.Namespace) -> int:
    from .hwprofile import available_targets, load_profile

    profiles = [load_profile(name) for name in available_targets()]
    if args.json:
        print(json.dumps([p.to_dict() for p in profiles], indent=1))
        return 0
    rows = [("target", "kind", "arch", "backend", "fp16 TFLOP/s", "fp32 TFLOP/s", "GB/s", "cores", "note")]
    for p in profiles:
        rows.append((p.name, p.kind, p.arch, p.backend, f"{p.peak('float16') / 1e12:.1f}",
                     f"{p.peak_flops['float32'] / 1e12:.1f}", f"{p.mem_bandwidth / 1e9:.0f}", str(p.cores),
                     "simulated" if p.simulated else p.description[:40]))
    print(_table(rows))
    return 0


def _load(args: argparse.Namespace):
    from .onnx_import import load_model, parse_shape_args

    return load_model(args.model, parse_shape_args(args.shape))


def cmd_inspect(args: argparse.Namespace) -> int:
    from .hwprofile import load_target

    path = Path(args.model)
    if path.is_dir() or path.name.endswith((".tar.gz", ".tgz")):
        return _inspect_pack(path, args.json)
    from .backends import get_backend
    from .partition import backend_tasks, summarize

    target = load_target(args.target)
    graph, tasks_in_order = backend_tasks(_load(args), get_backend(target))
    tasks = summarize(tasks_in_order)
    # by name, as the runtime skips them: a task with folded weights runs new nodes under the old names
    covered = {node.name for task in tasks_in_order for node in task.nodes}
    # what no task covers runs as glue (the backend's own runtime): a copy there is time no kernel wins back
    glue = Counter(node.op_type for node in graph.nodes if node.name not in covered)
    data = []
    for task, count in tasks:
        floor = target.profile.floor_seconds(task.flops, task.min_bytes, task.dtype)
        data.append({"task": task.label, "kind": task.kind, "key": task.key, "count": count,
                     "flops": task.flops, "min_bytes": task.min_bytes, "floor_seconds": floor,
                     "attrs": dict(task.attrs)})
    if args.json:
        print(json.dumps({"model": graph.name, "target": target.name, "tasks": data, "glue": dict(glue.most_common())},
                         indent=1, default=str))
        return 0
    rows = [("task", "x", "GFLOP", "MB", "floor", "bound")]
    for d in data:
        compute = d["flops"] / target.profile.peak(d["task"].rsplit(":", 1)[-1])
        rows.append((d["task"][:60], str(d["count"]), f"{d['flops'] / 1e9:.4g}", f"{d['min_bytes'] / 1e6:.4g}",
                     _ms(d["floor_seconds"]), "compute" if compute >= d["floor_seconds"] * 0.999 else "memory"))
    print(f"{graph.name}: {len(graph.nodes)} nodes, {sum(d['count'] for d in data)} tasks "
          f"({len(data)} distinct) on {target.name}")
    print(_table(rows))
    print("glue between the tasks: " + (", ".join(f"{op} x{n}" for op, n in glue.most_common()) or "none"))
    return 0


def _inspect_pack(path: Path, as_json: bool) -> int:
    from .pack import load_pack

    pack = load_pack(path)
    if as_json:
        print(json.dumps({"target": pack.target, "fingerprint": pack.fingerprint, "models": pack.models,
                          "entries": {k: {"task": e.task, "variant": e.variant, "origin": e.origin,
                                          "config": e.config, "seconds": e.seconds,
                                          "baseline_seconds": e.baseline_seconds,
                                          "floor_seconds": e.floor_seconds, "verdict": e.verdict.to_dict()}
                                      for k, e in pack.entries.items()}}, indent=1, default=str))
        return 0
    print(f"pack {path}: target {pack.target.get('name')} ({pack.target.get('backend')}), created {pack.created}, "
          f"portkern {pack.portkern_version}")
    print("fingerprint: " + ", ".join(f"{k}={v}" for k, v in pack.fingerprint.items()))
    rows = [("workload", "variant", "origin", "time", "baseline", "speedup", "floor %", "gate")]
    for key, e in sorted(pack.entries.items()):
        speedup = f"{e.baseline_seconds / e.seconds:.2f}x" if e.baseline_seconds else "-"
        rows.append((key, e.variant, e.origin, _ms(e.seconds), _ms(e.baseline_seconds), speedup,
                     f"{e.floor_seconds / e.seconds:.0%}", "passed" if e.verdict.passed else "FAILED"))
    print(_table(rows))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from .backends import get_backend
    from .hwprofile import load_target
    from .partition import backend_tasks, summarize
    from .profile import profile_tasks, write_trace

    backend = get_backend(load_target(args.target, args.backend))
    graph, tasks = backend_tasks(_load(args), backend)
    profiles = profile_tasks(summarize(tasks), backend, in_model=backend.baseline_in_model(graph, tasks, args.model))
    if args.trace:
        write_trace(tasks, profiles, args.trace)
    if args.json:
        print(json.dumps([p.to_dict() for p in profiles], indent=1, default=str))
        return 0
    total = sum(p.total_seconds for p in profiles) or 1.0
    rows = [("task", "x", "time", "share", "floor", "headroom", "baseline")]
    for p in profiles:
        rows.append((p.task.label[:56], str(p.count), _ms(p.seconds), f"{p.total_seconds / total:.1%}",
                     _ms(p.floor_seconds), _ms(p.headroom_seconds), p.baseline_source[:60]))
    print(_table(rows))
    if args.trace:
        print(f"trace written to {args.trace}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from .onnx_import import parse_shape_args
    from .tuner import TuneOptions, print_summary, run_tune

    proposers = tuple(args.proposer) if args.proposer else (
        ("builtin", "rules", "llm") if args.llm_endpoint else ("builtin", "rules"))
    options = TuneOptions(
        target=args.target, backend=args.backend, shapes=parse_shape_args(args.shape), trials=args.trials,
        per_task_trials=args.per_task_trials, time_budget_s=args.time_budget, storage=args.storage,
        work_dir=Path(args.work_dir) if args.work_dir else None, resume=args.resume, proposers=proposers,
        llm_endpoint=args.llm_endpoint, llm_model=args.llm_model, llm_max_requests=args.llm_max_requests,
        llm_max_tokens=args.llm_max_tokens, llm_timeout_s=args.llm_timeout, trial_timeout_s=args.trial_timeout,
        kernel_timeout_s=args.kernel_timeout or None,
        compile_workers=args.compile_workers, priors=not args.no_priors, allow_tf32=args.allow_tf32,
        skip_variants=tuple(args.skip_variant), max_tasks=args.max_tasks, seed=args.seed)
    progress = None if args.quiet or args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    report = run_tune(Path(args.model), options, Path(args.out), progress)
    report.command = " ".join(["portkern", *sys.argv[1:]])
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        print_summary(report)
    return 0


def _feeds(args: argparse.Namespace, graph: Any) -> dict[str, np.ndarray]:
    from .models import random_feeds

    if getattr(args, "inputs", None):
        try:
            with np.load(args.inputs) as data:
                return {name: data[name] for name in data.files}
        except (OSError, ValueError) as exc:
            raise PortkernError(f"cannot read inputs {args.inputs}: {exc}") from None
    return random_feeds(graph, seed=0)


def _session(args: argparse.Namespace):
    from .onnx_import import parse_shape_args
    from .runtime import Session

    shapes = parse_shape_args(args.shape) or None
    return Session(args.model, args.pack, shapes=shapes, allow_mismatch=args.allow_mismatch)


def cmd_run(args: argparse.Namespace) -> int:
    session = _session(args)
    feeds = _feeds(args, session.graph)
    start = time.perf_counter()
    outputs = session.run(feeds)
    elapsed = time.perf_counter() - start

    for (label, reason), count in Counter((t.label, r) for t, r in session.fallbacks).items():
        print(f"fallback to the baseline: {label} x{count}: {reason}", file=sys.stderr)
    if args.save:
        np.savez(args.save, **outputs)
    summary = {name: {"shape": list(v.shape), "dtype": str(v.dtype), "mean": float(np.mean(v)),
                      "std": float(np.std(v))} for name, v in outputs.items()}
    if args.json:
        print(json.dumps({"outputs": summary, "seconds": elapsed, "kernels": len(session.kernels),
                          "fallbacks": len(session.fallbacks)}, indent=1))
    else:
        print(f"ran {Path(args.model).name} in {_ms(elapsed)} with {len(session.kernels)} pack kernels, "
              f"{len(session.fallbacks)} tasks on the baseline")
        for name, s in summary.items():
            print(f"  {name}: {s['shape']} {s['dtype']} mean {s['mean']:.6g} std {s['std']:.6g}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import onnxruntime as ort

    from .measure import one_blas_thread
    from .runtime import Session, interleaved_latency

    session = _session(args)
    feeds = _feeds(args, session.graph)
    ort_session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    runners: dict[str, Callable[[], Any]] = {}
    if session.pack is not None:
        runners["portkern (pack)"] = lambda: session.run(feeds)
    reference = Session(session.graph)
    runners["reference executor"] = lambda: reference.run(feeds)
    runners["onnxruntime (CPU)"] = lambda: ort_session.run(None, feeds)
    # the reference executor's BLAS on one thread: its threads spin after each call and would
    # slow whichever runner comes next (onnxruntime, in this order)
    with one_blas_thread():
        rows = interleaved_latency(runners, args.repeats, synchronize=session.backend.synchronize
                                   if session.backend is not None else None)
    if args.json:
        print(json.dumps({"latency_seconds": rows, "repeats": args.repeats}, indent=1))
        return 0
    base = rows["onnxruntime (CPU)"]
    print(_table([("runner", "median latency", "vs onnxruntime")] +
                 [(name, _ms(t), f"{t / base:.2f}x") for name, t in rows.items()]))
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from .pack import load_pack, merge_packs, write_pack

    merged = merge_packs([load_pack(p) for p in args.packs])
    path = write_pack(merged, args.out)
    print(f"merged {len(args.packs)} packs into {path}: {len(merged.entries)} kernels, "
          f"{len(merged.models)} models")
    return 0


COMMANDS = {"targets": cmd_targets, "inspect": cmd_inspect, "profile": cmd_profile, "tune": cmd_tune,
            "run": cmd_run, "bench": cmd_bench, "pack": cmd_pack}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except PortkernError as exc:
        print(f"portkern: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("portkern: interrupted (finished trials are saved; continue with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
