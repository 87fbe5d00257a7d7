"""Where a tuned model's time goes inside onnxruntime, task by task: what the tuner's per-task
baseline (onnxruntime on the task's subgraph alone) says, what the same nodes take in the whole
model, and what each winner takes as a TVM kernel inside the model (backends/tvm/inline.py).

Rebuilds the winners of a benchmarks/models/tune_models.py result (as guard_audit.py does), runs
the model file and the model with every winner inside it with onnxruntime's profiler on, and reads
each node's kernel time (ort_subgraph.node_seconds: the median over the runs after a warm-up).
A task's nodes are found by name or by an output's name (onnxruntime names a conv chain it moves
to NCHWc after its last output); a task whose nodes were all fused into others under new names
shows no in-model time.

    python benchmarks/cpu/in_model_profile.py benchmarks/results/models-cpu-2026-12-05-inline-more-runs.json \
        --model bert-mini --runs 100
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from portkern.backends.tvm import inline
from portkern.models import random_feeds
from portkern.ort_subgraph import node_seconds

sys.path.insert(0, str(Path(__file__).parent))
from guard_audit import rebuild_winners  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
from tune_models import run_header  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result")
    parser.add_argument("--model", required=True)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--json")
    args = parser.parse_args()

    rebuilt = rebuild_winners(args.result, args.model)
    graph, backend, threads = rebuilt.graph, rebuilt.backend, rebuilt.backend.target.profile.cores
    feeds = random_feeds(graph, seed=3)
    occurrences = [task for task in rebuilt.tasks if task.key in rebuilt.entries]
    kernels = [(t, rebuilt.entries[t.key].artifact) for t in occurrences]
    alone = {name: s * 1e6 for name, s in node_seconds(inline.named_model(graph, rebuilt.path), feeds, args.runs,
                                                       threads).items()}
    with_kernels = {name: s * 1e6 for name, s in node_seconds(inline.inline_model(graph, kernels, threads, rebuilt.path),
                                                              feeds, args.runs, threads, inline.op_library()).items()}
    rows = []
    print(f"{args.model}: {len(rebuilt.entries)} winners, {len(occurrences)} occurrences; microseconds per occurrence")
    print(f"  {'task':58s} {'base alone':>10s} {'ORT in model':>12s} {'TVM alone':>10s} {'TVM in model':>12s}  status")
    for key, info in rebuilt.info.items():
        tasks = [t for t in occurrences if t.key == key]
        found = [{name for node in t.nodes for name in (node.name, *node.outputs) if name in alone} for t in tasks]
        in_model = [sum(alone[name] for name in names) for names in found if names] or [float("nan")]  # fused away
        kernel = [with_kernels.get(f"{t.nodes[-1].name}::tvm") for t in tasks]
        row = {"task": tasks[0].label, "count": len(tasks), "status": info["status"],
               "baseline_alone_us": info["baseline_seconds"] * 1e6, "tvm_alone_us": info["best_seconds"] * 1e6,
               "onnxruntime_in_model_us": statistics.median(in_model),
               "tvm_in_model_us": statistics.median(k for k in kernel if k is not None)}
        rows.append(row)
        print(f"  {row['task'][:58]:58s} {row['baseline_alone_us']:10.1f} {row['onnxruntime_in_model_us']:12.1f} "
              f"{row['tvm_alone_us']:10.1f} {row['tvm_in_model_us']:12.1f}  {row['status'][:50]}")
    total_alone, total_kernels = sum(alone.values()), sum(with_kernels.values())
    print(f"  all nodes: {total_alone:.0f} us in the model file, {total_kernels:.0f} us with every winner inside it")
    if args.json:
        Path(args.json).write_text(json.dumps({**run_header(backend.fingerprint()), "model": args.model,
                                               "runs": args.runs, "rows": rows, "all_nodes_us": {
                                                   "model_file": total_alone, "with_winners": total_kernels}},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
