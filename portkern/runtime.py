"""Run a model with a kernel pack: the pack's kernels where they match, the baseline elsewhere.

Anything missing or mismatched falls back to the backend's baseline op for that task (onnxruntime on
the CPU, torch on a GPU) or, where it has none, the reference executor - loudly (logged, and listed
in `Session.fallbacks`). Without a pack, the whole model runs in the reference executor. A pack made
on other hardware or software is refused unless the caller allows the mismatch, in which case every
kernel is re-verified by the gate before it is used.

A run is a list of steps in graph order: kernels, baseline ops, stretches of the model run by the
backend's own runtime (`Backend.stretch_runner`), and the reference executor for what is left; or,
where the backend's runtime can call the kernels itself (`Backend.graph_runner`: TVM's kernels as
onnxruntime custom ops), one step, the whole model in that runtime with no cut at any kernel. On a
backend whose memory is the host (TVM) the values between steps are host arrays. On any other (Triton)
they stay on the device: feeds go there once, every step reads and writes device buffers, and only
the graph outputs come back (feeds that are device buffers already, with `outputs_on_device`, never
cross to the host at all). A node the device cannot run goes to the executor on the host and back,
listed in `Session.host_fallbacks`. On a real GPU (shapes are always static: the import binds them)
the whole device part of a run is captured once into a CUDA graph after a warm-up run and replayed;
if capture fails the run stays step by step, said in the log and in `Session.cuda_graph_error`.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .backends import get_backend
from .backends.base import Backend, ExecutorStretch, ProducingProgram, Program, StretchPiece, aligned_empty
from .errors import PackError
from .executor import array_spec, check_feeds, run_graph
from .hwprofile import load_target
from .ir import Graph, Node, TensorSpec
from .onnx_import import load_model
from .pack import Pack, PackEntry, fingerprint_mismatch, load_pack
from .partition import backend_tasks, partition
from .tasks import Task
from .verify import verify

log = logging.getLogger("portkern.runtime")

Values = dict[str, Any]  # value name -> host array or device buffer (see the module docstring)


@dataclass
class BoundKernel:
    task: Task
    program: Program
    entry: PackEntry | None  # None: the backend's baseline op standing in for a missing kernel


@dataclass
class Step:
    """One call of a run, made at the place of its last node in graph order."""

    label: str
    run: Callable[[Values], None]


def _pack_shapes(pack: Pack, model: str | Path | bytes) -> dict[str, tuple[int, ...]] | None:
    """The input shapes this model was tuned for, so `run --pack` needs no --shape."""
    info = pack.models.get(_file_hash(model)) if pack.models else None
    return {k: tuple(v) for k, v in info["shapes"].items()} if info else None


class Session:
    """portkern.Session(model, pack): a model ready to run with its tuned kernels."""

    def __init__(self, model: str | Path | bytes | Graph, pack: str | Path | Pack | None = None, *,
                 shapes: Mapping[str, tuple[int, ...]] | None = None, allow_mismatch: bool = False,
                 source: str | Path | bytes | None = None) -> None:
        """source: the model file a Graph was loaded from (a path or bytes are their own source);
        where the pack covers nothing, the backend's runtime may run it as it is."""
        self.pack = load_pack(pack) if isinstance(pack, (str, Path)) else pack
        self.source = source if isinstance(model, Graph) else model
        if isinstance(model, Graph):
            self.graph = model
        else:
            if shapes is None and self.pack is not None:
                shapes = _pack_shapes(self.pack, model)
            self.graph = load_model(model, shapes)
        self.backend: Backend | None = None
        if self.pack is not None:
            self.backend = get_backend(load_target(self.pack.target["name"], self.pack.target.get("backend")))
        # the tasks as the tune made them (what the pack's keys name)
        if self.backend is not None:
            self.graph, self.tasks = backend_tasks(self.graph, self.backend)
        else:
            self.tasks = partition(self.graph)
        self._consumers = self.graph.consumers()
        self.kernels: list[BoundKernel] = []  # the pack's kernels
        self.baselines: list[BoundKernel] = []  # the backend's baseline op where the pack has none
        # stretches of the model the pack does not cover, each run by the backend's own runtime
        self.pieces: list[tuple[list[Node], StretchPiece]] = []
        self.fallbacks: list[tuple[Task, str]] = []
        # on a device backend: nodes run by the executor on the host, a device round trip each
        self.host_fallbacks: list[tuple[Node, str]] = []
        self.steps: list[Step] = []
        self.cuda_graph_error: str | None = None
        self._device_inputs: Values | None = None  # static input buffers, filled by each run
        self._cuda_graph: _CudaGraph | None = None  # on a real GPU: warmed up, then captured
        self._leftovers: list[tuple[list[Node], list[str]]] = []  # stretches left to the executor, outputs
        if self.pack is not None:
            self._bind(allow_mismatch)

    def _bind(self, allow_mismatch: bool) -> None:
        assert self.pack is not None and self.backend is not None
        target = self.backend.target
        differences = fingerprint_mismatch(self.pack, self.backend.fingerprint())
        if differences and not allow_mismatch:
            raise PackError(f"pack {self.pack.path} was made for other hardware/software "
                            f"({'; '.join(differences[:3])}); use --allow-mismatch to re-verify and use it")
        for task in self.tasks:
            entry = self.pack.entry_for(task.key)
            if entry is None:
                self.fallbacks.append((task, "no kernel in the pack"))
                continue
            if entry.backend != target.backend:
                self.fallbacks.append((task, f"pack kernel is for backend {entry.backend}"))
                continue
            try:
                program = self.backend.load(entry.artifact, task)
            except Exception as exc:  # a kernel that cannot load is a fallback, said out loud
                self.fallbacks.append((task, f"kernel failed to load: {exc}"))
                continue
            if differences:
                verdict = verify(self.backend, program, task, entry.verdict.precision)
                if not verdict.passed:
                    self.fallbacks.append((task, f"re-verification failed: {verdict.reason}"))
                    continue
            self.kernels.append(BoundKernel(task, program, entry))
        for task, reason in self.fallbacks:
            log.warning("fallback to the baseline for %s: %s", task.label, reason)
        whole = self.backend.graph_runner(self.graph, [(bound.task, bound.entry.artifact)
                                                       for bound in self.kernels if bound.entry is not None],
                                          self.source)
        if whole is not None:  # the kernels inside the backend's runtime: one piece, one step
            self.pieces = [(list(self.graph.nodes), whole)]
            self.steps = [self._piece_step(f"{len(self.kernels)} kernels inside the model's runtime", whole.run)]
            return
        self._cover_rest()
        self.steps = self._ordered_steps()

    # --- who runs each node --------------------------------------------------------------------
    def _cover_rest(self) -> None:
        """Run what the pack does not cover in the backend's own runtime, in the order the backend
        prefers (`stretches_span_tasks`): whole uncovered stretches first (glue and untuned tasks
        together, onnxruntime), then each untuned task left on its baseline op; or each untuned
        task on its baseline op first (cuBLAS, SDPA), then the stretches between. The reference
        executor runs the rest."""
        assert self.backend is not None
        backend = self.backend
        covered = {node.name for bound in self.kernels for node in bound.task.nodes}
        untuned = [task for task, _ in self.fallbacks]
        if not backend.stretches_span_tasks:
            covered |= self._bind_baselines(untuned)
        for stretch in self._stretches(covered):
            inputs, outputs = self._boundary(stretch)
            if not outputs:  # nothing reads what it computes: nothing to run
                covered.update(node.name for node in stretch)
                continue
            graph = self.graph
            whole = len(stretch) == len(graph.nodes)
            piece = backend.stretch_runner(stretch, {v: graph.values[v] for v in inputs},
                                           {v: graph.values[v] for v in outputs}, graph.constants, graph.opset,
                                           source=self.source if whole else None)
            if piece is not None:
                self.pieces.append((stretch, piece))
                self.host_fallbacks += piece.host_nodes
                covered.update(node.name for node in stretch)
        if backend.stretches_span_tasks:
            covered |= self._bind_baselines([task for task in untuned
                                             if not all(node.name in covered for node in task.nodes)])
        self._leftovers = [(stretch, self._boundary(stretch)[1]) for stretch in self._stretches(covered)]
        if not backend.host_memory:
            reason = f"the {backend.name} backend has no runtime for it on its device"
            self.host_fallbacks += [(node, reason) for stretch, _ in self._leftovers for node in stretch]
        if self.host_fallbacks:
            counts = Counter(f"{node.op_type} ({reason})" for node, reason in self.host_fallbacks)
            log.warning("%d nodes run in the reference executor on the host, a device round trip each: %s",
                        len(self.host_fallbacks), "; ".join(f"{what} x{n}" for what, n in counts.items()))

    def _bind_baselines(self, tasks: list[Task]) -> set[str]:
        """Each task on the backend's baseline op where it has one; the names of the nodes bound."""
        assert self.backend is not None
        bound: set[str] = set()
        for task in tasks:
            baseline = self.backend.baseline(task)
            if baseline is not None:
                self.baselines.append(BoundKernel(task, baseline, None))
                bound.update(node.name for node in task.nodes)
        return bound

    def _stretches(self, covered: set[str]) -> list[list[Node]]:
        """Maximal runs of consecutive nodes that nothing in `covered` runs."""
        stretches: list[list[Node]] = []
        stretch: list[Node] = []
        for node in self.graph.nodes:
            if node.name not in covered:
                stretch.append(node)
            elif stretch:
                stretches.append(stretch)
                stretch = []
        return stretches + ([stretch] if stretch else [])

    def _boundary(self, stretch: list[Node]) -> tuple[list[str], list[str]]:
        """The values a stretch reads from outside (constants aside) and those read after it."""
        names = {node.name for node in stretch}
        produced = [value for node in stretch for value in node.outputs if value]
        inputs = list(dict.fromkeys(value for node in stretch for value in node.inputs
                                    if value and value not in produced and value not in self.graph.constants))
        outputs = [value for value in produced if value in self.graph.outputs
                   or any(user.name not in names for user in self._consumers.get(value, []))]
        return inputs, outputs

    # --- the steps of a run --------------------------------------------------------------------
    def _ordered_steps(self) -> list[Step]:
        """Every call of a run in graph order, each at its last node; nodes no kernel, baseline or
        piece runs go to the reference executor, a stretch of them at a time."""
        at: dict[str, Step] = {}
        for bound in [*self.kernels, *self.baselines]:
            at[bound.task.nodes[-1].name] = self._kernel_step(bound)
        for stretch, piece in self.pieces:
            at[stretch[-1].name] = self._piece_step(f"{len(stretch)} nodes from {stretch[0].name}", piece.run)
        for stretch, outputs in self._leftovers:
            at[stretch[-1].name] = self._piece_step(f"executor: {len(stretch)} nodes from {stretch[0].name}",
                                                    self._executor(stretch, outputs))
        return [at[node.name] for node in self.graph.nodes if node.name in at]

    def _executor(self, stretch: list[Node], outputs: list[str]) -> ExecutorStretch:
        assert self.backend is not None
        graph = self.graph
        if self.backend.host_memory:
            return ExecutorStretch(stretch, outputs, graph.constants, graph.opset, np.asarray, _unchanged)
        return ExecutorStretch(stretch, outputs, graph.constants, graph.opset,
                               self.backend.to_host, self.backend.to_device)

    @staticmethod
    def _piece_step(label: str, piece: Callable[[Values], Values]) -> Step:
        return Step(label, lambda values: values.update(piece(values)))

    def _kernel_step(self, bound: BoundKernel) -> Step:
        """A kernel or baseline op. Its weights move to the device once. On host memory it views
        the graph's arrays and writes fresh aligned ones; on a device it writes its own output
        buffers, allocated once: static addresses a CUDA graph replays. A framework op that makes
        its own result (ProducingProgram) hands that on uncopied: a CUDA graph's memory pool
        keeps what it allocated during capture at the same addresses in every replay."""
        assert self.backend is not None
        backend, task, program = self.backend, bound.task, bound.program
        weights = {}
        for name in task.input_names:
            constant = task.constants[name] if name in task.constants else self.graph.constants.get(name)
            if constant is not None:
                weights[name] = backend.to_device(constant)
        if backend.host_memory:
            def run_on_host(values: Values) -> None:
                inputs = [weights[name] if name in weights else backend.view(values[name])
                          for name in task.input_names]
                arrays = [aligned_empty(spec) for spec in task.outputs]
                program(inputs, [backend.view(array) for array in arrays])
                values.update(zip(task.output_names, arrays))
            return Step(task.label, run_on_host)
        if isinstance(program, ProducingProgram):  # a framework op: its own result, no copy
            def run_produced(values: Values) -> None:
                produced = program.produce([weights[name] if name in weights else values[name]
                                            for name in task.input_names])
                values.update(zip(task.output_names, produced))
            return Step(task.label, run_produced)
        outputs = [backend.empty(spec, 0.0) for spec in task.outputs]

        def run_on_device(values: Values) -> None:
            program([weights[name] if name in weights else values[name] for name in task.input_names], outputs)
            values.update(zip(task.output_names, outputs))
        return Step(task.label, run_on_device)

    # --- running -------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], outputs_on_device: bool = False) -> dict[str, Any]:
        """The graph outputs for these feeds: host arrays, or each feed already one of the
        backend's device buffers (a torch tensor for Triton), which then never crosses to the
        host. outputs_on_device: the outputs as device buffers of their own (copies on the
        device, so the next run does not overwrite them), none copied back to the host."""
        if self.backend is None:
            return run_graph(self.graph, dict(feeds))
        backend = self.backend
        check_feeds(self.graph, feeds, self._spec)
        if backend.host_memory:
            values: Values = {name: np.asarray(value) for name, value in feeds.items()}
            self._run_steps(values)
            return {name: values[name] if name in values else self.graph.constants[name]
                    for name in self.graph.outputs}
        outputs = self._run_on_device(feeds)
        if outputs_on_device:
            return {name: self._device_copy(outputs[name]) if name in outputs
                    else backend.to_device(self.graph.constants[name]) for name in self.graph.outputs}
        return {name: backend.to_host(outputs[name]) if name in outputs else self.graph.constants[name]
                for name in self.graph.outputs}

    def _spec(self, value: Any) -> TensorSpec:
        """A feed's or buffer's shape and dtype: one of the backend's buffers, or an array."""
        spec = self.backend.buffer_spec(value) if self.backend is not None else None
        return spec if spec is not None else array_spec(value)

    def _device_copy(self, buffer: Any) -> Any:
        assert self.backend is not None
        copy = self.backend.empty(self._spec(buffer), 0.0)
        self.backend.copy_into(copy, buffer)
        return copy

    def _run_steps(self, values: Values) -> Values:
        """Every step in order; the graph outputs among the values."""
        for step in self.steps:
            step.run(values)
        return {name: values[name] for name in self.graph.outputs if name in values}

    def _run_on_device(self, feeds: Mapping[str, np.ndarray]) -> Values:
        """Feeds into the static input buffers, then the steps: on a real GPU the first run is the
        warm-up (Triton compiles, cuBLAS/cuDNN set up), the second captures a CUDA graph and every
        run from then on replays it; elsewhere, or when capture fails, step by step."""
        assert self.backend is not None
        backend = self.backend
        if self._device_inputs is None:
            self._device_inputs = {name: backend.empty(self.graph.values[name], 0.0) for name in self.graph.inputs}
        for name, buffer in self._device_inputs.items():
            feed = feeds[name]
            backend.copy_into(buffer, feed if backend.buffer_spec(feed) is not None else np.asarray(feed))
        inputs = self._device_inputs

        def run() -> Values:
            return self._run_steps(dict(inputs))
        # a backend on a real CUDA device says so (TritonBackend.on_gpu)
        if not getattr(backend, "on_gpu", False) or self.cuda_graph_error is not None:
            return run()
        if self._cuda_graph is None:
            if self.host_fallbacks:
                return self._no_cuda_graph(f"{len(self.host_fallbacks)} nodes run on the host", run)
            self._cuda_graph = _CudaGraph(run)
            return self._cuda_graph.warm_up()
        if not self._cuda_graph.captured:
            try:
                self._cuda_graph.capture()
            except Exception as exc:  # a step that synchronizes or copies from the host mid-run
                self._cuda_graph = None
                return self._no_cuda_graph(f"capture failed: {type(exc).__name__}: {exc}", run)
        return self._cuda_graph.replay()

    def _no_cuda_graph(self, reason: str, run: Callable[[], Values]) -> Values:
        self.cuda_graph_error = reason
        log.warning("no CUDA graph, the run stays step by step: %s", reason)
        return run()

    @property
    def replays_cuda_graph(self) -> bool:
        return self._cuda_graph is not None and self._cuda_graph.captured

    def latency(self, feeds: Mapping[str, Any], repeats: int = 10, warmup: int = 2,
                outputs_on_device: bool = False) -> list[float]:
        """Seconds per whole-model run, feeds and outputs where `run` is given them (host arrays,
        or device buffers): the host clock with the device synchronized before and after, so no
        queued work is missed (on a GPU the warm-up runs also capture the CUDA graph that the
        timed runs replay)."""
        synchronize = self.backend.synchronize if self.backend is not None else _nothing
        for _ in range(warmup):
            self.run(feeds, outputs_on_device)
        times = []
        for _ in range(repeats):
            synchronize()
            start = time.perf_counter()
            self.run(feeds, outputs_on_device)
            synchronize()
            times.append(time.perf_counter() - start)
        return times


RUNNER_PAUSE_S = 0.2


def interleaved_latency(runners: dict[str, Callable[[], Any]], repeats: int, rounds: int = 5,
                        synchronize: Callable[[], None] | None = None,
                        pause_s: float = RUNNER_PAUSE_S) -> dict[str, float]:
    """Median seconds per run of each runner, timed in alternating rounds after a warm-up each,
    so a change in the machine's state (clocks, caches, other load) hits every runner alike. A
    pause between runners lets thread pools that spin after a run (onnxruntime's) go idle first."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    per_round = max(1, -(-repeats // rounds))
    sync = synchronize or (lambda: None)
    for _ in range(rounds):
        for name, run in runners.items():
            run()
            for _ in range(per_round):
                sync()
                start = time.perf_counter()
                run()
                sync()
                times[name].append(time.perf_counter() - start)
            time.sleep(pause_s)
    return {name: float(np.median(values)) for name, values in times.items()}


class _CudaGraph:
    """The device part of a run as one CUDA graph. Warm-up and capture use the same side stream,
    so cuBLAS and cuDNN make their per-stream workspaces during the warm-up, not mid-capture;
    the captured outputs are static buffers that each replay (on the current stream, after the
    feeds' copies) overwrites."""

    def __init__(self, run: Callable[[], Values]) -> None:
        import torch

        self.run = run
        self.stream = torch.cuda.Stream()
        self.graph: Any = None
        self.outputs: Values = {}

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def warm_up(self) -> Values:
        import torch

        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            outputs = self.run()
        torch.cuda.current_stream().wait_stream(self.stream)
        return outputs

    def capture(self) -> None:
        import torch

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self.outputs = self.run()
        self.graph = graph

    def replay(self) -> Values:
        self.graph.replay()
        return self.outputs


def _unchanged(array: np.ndarray) -> np.ndarray:
    return array


def _nothing() -> None:
    """No device to wait for: the reference executor runs on the host."""


def _file_hash(model: str | Path | bytes) -> str:
    import hashlib

    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    return hashlib.sha256(data).hexdigest()
