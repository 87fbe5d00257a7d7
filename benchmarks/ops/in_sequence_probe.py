"""Why a kernel's time in a model differs from the time the search measured: one task's kernels
(variant + config each) timed in several contexts, side by side in one process on one GPU.

- harness: portkern's own timing (each run alone behind a spin kernel, three rotating input sets),
  what the search ranks candidates by;
- graph: CUDA-graph replay of one input set (every input warm in L2);
- after-producer: the profiler's device time of the kernel inside a replayed graph of 12 x
  [an elementwise kernel writes the first input, the kernel runs], as in a model, where the
  activation was just written by the op before (LayerNorm, the previous GEMM);
- model_weights: as after-producer, but each of the 12 kernels reads its own weights (every input
  but the first drawn anew), as a model's layers do: the activation is warm, the weights come from
  HBM, as no L2 holds twelve layers' weights;
- model_buffers: as model_weights, and each kernel also reads its own activation and writes its own
  output, as a model's runtime allocates one output buffer per task (twelve 25 MB outputs for BERT's
  FFN GEMM: pages and L2 lines no earlier kernel touched);
- sustained: the same graph's kernels back to back with no producer (the card's clocks under
  continuous tensor-core load, as in a model's run of GEMMs), and that graph's replay time per
  kernel from events (what the kernel costs a model: its device time plus the gap before the next
  kernel starts).

    python benchmarks/ops/in_sequence_probe.py --suite gemm-epilogue --filter bert \\
        --choices '[["gemm_pingpong", {"STAGES": 4}], ["gemm_tma", {"BLOCK_N": 256}]]' --out probe.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from portkern.backends import get_backend
from portkern.backends.triton.modules import builtin_variants
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, device_inputs, kernel_device_times, time_program
from portkern.profile import floor_seconds
from portkern.tasks import Task
from portkern.verify import _poisoned

sys.path.insert(0, str(Path(__file__).parent))
from _gluon_probe import write_record  # noqa: E402
from bench_ops import suites  # noqa: E402
from variant_ab import gated_program  # noqa: E402

_SEQUENCE = 12  # kernels per replayed graph: BERT-base's layers


def _graph(body: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """The body captured once (after a warm-up run on a side stream, as CUDA graphs require)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def _replay_us(graph: torch.cuda.CUDAGraph, replays: int = 20) -> float:
    """Median event-timed replay of the graph, per kernel of the task in it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / _SEQUENCE)
    return statistics.median(times)


def _contexts(backend: Any, program: Any, task: Task, sets: list[list[Any]], layers: list[list[Any]],
              measure: MeasureOptions) -> dict[str, Any]:
    from triton.testing import do_bench_cudagraph
    outputs = [_poisoned(backend, spec) for spec in task.outputs]
    inputs = sets[0]
    activation = inputs[0]
    source = activation.clone()
    result: dict[str, Any] = {
        "harness_us": time_program(backend, program, task, measure, inputs=sets).median * 1e6,
        "graph_us": do_bench_cudagraph(lambda: program(inputs, outputs), rep=200) * 1e3}

    def after_producer() -> None:
        for _ in range(_SEQUENCE):
            torch.mul(source, 1.0, out=activation)
            program(inputs, outputs)

    def model_weights() -> None:
        for layer in layers:
            torch.mul(source, 1.0, out=activation)
            program([activation, *layer[1:]], outputs)

    own_outputs = [[_poisoned(backend, spec) for spec in task.outputs] for _ in layers]

    def model_buffers() -> None:
        for layer, layer_outputs in zip(layers, own_outputs):
            torch.mul(source, 1.0, out=layer[0])
            program(layer, layer_outputs)

    def sustained() -> None:
        for _ in range(_SEQUENCE):
            program(inputs, outputs)

    for name, body in (("after_producer", after_producer), ("model_weights", model_weights),
                       ("model_buffers", model_buffers), ("sustained", sustained)):
        graph = _graph(body)
        kernels = {time.kernel[:80]: time.device_us_per_run / time.calls_per_run
                   for time in kernel_device_times(graph.replay, runs=20, warmup=3)}
        result[f"{name}_kernels_us"] = kernels
        result[f"{name}_us"] = max(kernels.values())  # the task's kernel is the long one in the graph
        result[f"{name}_replay_us"] = _replay_us(graph)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="gemm-epilogue", help="a bench_ops suite")
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--choices", required=True, help="JSON list of [variant, config over its DEFAULT]")
    parser.add_argument("--rounds", type=int, default=2, help="each choice timed this many times, alternating")
    parser.add_argument("--target", default="h200", help="the hwprofile whose floors the rows report")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this probe times CUDA graphs: it needs a GPU")
    target = load_target(args.target)
    backend = get_backend(target)
    library = {v.name: v for v in builtin_variants()}
    measure = MeasureOptions(warmup=5, repeats=50, input_sets=3)
    rows = []
    for case, task in suites(False)[args.suite]:
        if args.filter not in case:
            continue
        sets = device_inputs(backend, task, measure.input_sets)
        layers = device_inputs(backend, task, _SEQUENCE, seed=101)
        programs = []
        for name, config in json.loads(args.choices):
            program, status = gated_program(backend, library[name], config, task)
            print(f"{case} {name} {config}: {status['status']} {status.get('reason', '')}", flush=True)
            if program is not None:
                programs.append((name, config, program))
        timings: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(programs))}
        for round_ in range(args.rounds):
            order = list(enumerate(programs))
            for i, (name, config, program) in order if round_ % 2 == 0 else order[::-1]:
                timings[i].append(_contexts(backend, program, task, sets, layers, measure))
        for i, (name, config, _) in enumerate(programs):
            summary = {context: statistics.median(t[f"{context}_us"] for t in timings[i])
                       for context in ("harness", "graph", "after_producer", "model_weights", "model_weights_replay",
                                     "model_buffers", "model_buffers_replay",
                                     "sustained", "sustained_replay")}
            row = {"case": case, "task": task.describe(), "variant": name, "config": config,
                   "floor_us": floor_seconds(task, target) * 1e6, "median_us": summary, "rounds": timings[i]}
            print(f"{case:32s} {name:14s} " + "  ".join(f"{k}={v:7.2f}us" for k, v in summary.items()), flush=True)
            rows.append(row)
    write_record(args.out, "one task's kernels timed by the harness, by graph replay, after a producer "
                 "and back to back (profiler device time inside replayed graphs)", rows, backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
