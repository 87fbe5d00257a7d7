"""A/B of one built-in kernel: the library's version (or an experiment's file, --new) against another
(a file: an earlier commit's, `git show REV:portkern/backends/triton/kernels/NAME.py`), in one process
on one GPU, so a change to a kernel is judged by a measured ratio, not by two runs on two machines.

For every case of the chosen bench_ops suites and every config, both versions pass the verification
gate, then each is timed in turn twice (A B B A, so drift and position cancel) by portkern's harness (device time
behind a spin kernel, three rotating input sets: what the search sees) and by CUDA-graph replay of
one input set (what a graph-captured model sees; GPUs only); torch eager is timed beside them.

    git show HEAD:portkern/backends/triton/kernels/attention_pingpong.py > /tmp/base.py
    python benchmarks/ops/variant_ab.py --variant attention_pingpong --base /tmp/base.py --suite attention \\
        --configs '[{}, {"STAGES": 3}]' --out ab.json

The base can also be another built-in kernel in one config (--base-variant, --base-config): a new
variant judged against the kernel the search keeps today.

    python benchmarks/ops/variant_ab.py --variant gemm_pingpong --base-variant gemm_tma --suite gemm \\
        --configs '[{}, {"BLOCK_N": 256, "BLOCK_M": 64}]' --out ab.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from portkern.backends import get_backend
from portkern.backends.base import Candidate, ProducingProgram, Variant
from portkern.backends.triton import baselines
from portkern.backends.triton.modules import builtin_variant, builtin_variants
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, device_inputs, time_program
from portkern.profile import floor_seconds
from portkern.tasks import Task
from portkern.verify import GateOptions, _poisoned, verify

sys.path.insert(0, str(Path(__file__).parent))
from _gluon_probe import write_record  # noqa: E402
from bench_ops import rate, suites, time_callable  # noqa: E402


def graph_seconds(backend: Any, program: Any, task: Task, inputs: list[Any]) -> float:
    """Median replay time of the program captured in a CUDA graph (triton's do_bench_cudagraph)."""
    from triton.testing import do_bench_cudagraph
    if isinstance(program, ProducingProgram):
        return do_bench_cudagraph(lambda: program.produce(inputs), rep=200) / 1e3
    outputs = [_poisoned(backend, spec) for spec in task.outputs]
    return do_bench_cudagraph(lambda: program(inputs, outputs), rep=200) / 1e3


def gated_program(backend: Any, variant: Variant, config: dict[str, Any], task: Task) -> tuple[Any, dict[str, Any]]:
    """(the loaded program or None, its row: status and why) of one version in one config."""
    candidate = Candidate.of(variant, {**variant.default, **config})
    problem = backend.check(candidate, task)
    if problem is not None:
        return None, {"status": "refused", "reason": problem}
    program = backend.load(backend.compile(candidate, task), task)
    verdict = verify(backend, program, task, variant.precision, GateOptions(seeds=(11, 23)))
    if not verdict.passed:
        return None, {"status": "wrong", "reason": verdict.reason}
    return program, {"status": "ok", "harness": [], "graph": []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", required=True, help="a built-in kernel's name (kernels/NAME.py)")
    base = parser.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", type=Path, help="the other version's kernel file")
    base.add_argument("--base-variant", help="another built-in kernel as the base, in --base-config")
    parser.add_argument("--base-config", default="{}", help="JSON: the base's config over its DEFAULT (every case)")
    parser.add_argument("--new", type=Path, help="the version to judge, if not the library's")
    parser.add_argument("--suite", default="attention", help="bench_ops suites, comma-separated")
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--configs", default="[{}]", help="JSON list of configs, each over the variant's DEFAULT")
    parser.add_argument("--target", default="h200", help="the hwprofile whose floors the rows report")
    parser.add_argument("--smoke", action="store_true", help="bench_ops' tiny shapes: checks the script on a CPU")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    measure = MeasureOptions(warmup=5, repeats=50, input_sets=3) if not args.smoke else MeasureOptions(1, 3, 3)
    target = load_target(args.target)
    backend = get_backend(target)
    library = {v.name: v for v in builtin_variants()}
    for name in (args.variant, args.base_variant):
        if name is not None and name not in library:
            parser.error(f"no built-in kernel named '{name}'")
    new = builtin_variant(args.variant, args.new.read_text()) if args.new else library[args.variant]
    base = library[args.base_variant] if args.base_variant else builtin_variant(args.variant, args.base.read_text())
    base_config = json.loads(args.base_config) if args.base_variant else None
    versions = {"base": base, "new": new}
    rows = []
    for suite in args.suite.split(","):
        for name, task in suites(args.smoke)[suite]:
            if args.filter not in name:
                continue
            sets = device_inputs(backend, task, measure.input_sets)
            eager = baselines.for_task(task)
            eager_s = statistics.median(time_callable(backend, eager, sets, measure.repeats)) if eager else None
            for config in json.loads(args.configs):
                row: dict[str, Any] = {"case": name, "task": task.describe(), "config": config,
                                       "floor_seconds": floor_seconds(task, target), "torch_eager_s": eager_s}
                configs = {"base": config if base_config is None else base_config, "new": config}
                row["base_config"] = configs["base"]
                gated = {label: gated_program(backend, variant, configs[label], task)
                         for label, variant in versions.items()}
                runs = {label: run for label, (_, run) in gated.items()}
                order = list(gated.values())
                for programs in (order, order[::-1]):  # A B B A: drift and position cancel in the pair
                    for program, run in programs:
                        if program is not None:
                            run["harness"].append(time_program(backend, program, task, measure, inputs=sets).median)
                            if torch.cuda.is_available():
                                run["graph"].append(graph_seconds(backend, program, task, sets[0]))
                for label, run in runs.items():
                    if run["status"] == "ok":
                        run["rate"] = rate(task, min(run["harness"]), target)
                        if eager_s:
                            run["vs_eager"] = eager_s / min(run["harness"])
                    row[label] = run
                if runs["base"]["status"] == runs["new"]["status"] == "ok":
                    row["new_vs_base"] = {kind: min(runs["base"][kind]) / min(runs["new"][kind])
                                          for kind in ("harness", "graph") if runs["new"][kind]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    new_name = args.new or "the library's"
    base_name = f"{args.base_variant} {base_config}" if args.base_variant else args.base
    write_record(args.out, f"A/B of {args.variant}: {base_name} (base) vs {new_name} (new)", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
