"""Run a model with a kernel pack: the pack's kernels where they match, the baseline elsewhere.

Anything missing or mismatched falls back to the backend's baseline op for that task (onnxruntime on
the CPU, torch on a GPU) or, where it has none, the reference executor - loudly (logged, and listed
in `Session.fallbacks`). Without a pack, the whole model runs in the reference executor. A pack made on other hardware or software is refused unless the caller allows
the mismatch, in which case every kernel is re-verified by the gate before it is used.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from .backends import get_backend
from .backends.base import Backend, Program, aligned_empty
from .errors import PackError
from .executor import run_graph
from .hwprofile import load_target
from .ir import Graph, Node
from .onnx_import import load_model
from .pack import Pack, PackEntry, fingerprint_mismatch, load_pack
from .partition import partition
from .tasks import Task
from .verify import verify

log = logging.getLogger("portkern.runtime")


@dataclass
class BoundKernel:
    task: Task
    program: Program
    entry: PackEntry | None  # None: the backend's baseline op standing in for a missing kernel


def _pack_shapes(pack: Pack, model: str | Path | bytes) -> dict[str, tuple[int, ...]] | None:
    """The input shapes this model was tuned for, so `run --pack` needs no --shape."""
    info = pack.models.get(_file_hash(model)) if pack.models else None
    return {k: tuple(v) for k, v in info["shapes"].items()} if info else None


class Session:
    """portkern.Session(model, pack): a model ready to run with its tuned kernels."""

    def __init__(self, model: str | Path | bytes | Graph, pack: str | Path | Pack | None = None, *,
                 shapes: Mapping[str, tuple[int, ...]] | None = None, allow_mismatch: bool = False) -> None:
        self.pack = load_pack(pack) if isinstance(pack, (str, Path)) else pack
        if isinstance(model, Graph):
            self.graph = model
        else:
            if shapes is None and self.pack is not None:
                shapes = _pack_shapes(self.pack, model)
            self.graph = load_model(model, shapes)
        self.tasks = partition(self.graph)
        self._consumers = self.graph.consumers()
        self.kernels: list[BoundKernel] = []  # the pack's kernels
        # stretches of the model the pack does not cover, each run by the backend's runtime
        self.pieces: list[tuple[list[Node], Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]]] = []
        self.baselines: list[BoundKernel] = []  # the backend's baseline op where the pack has none
        self.fallbacks: list[tuple[Task, str]] = []
        self.backend: Backend | None = None
        if self.pack is not None:
            self._bind(allow_mismatch)
        self._constant_buffers: dict[tuple[str, str], Any] = {}

    def _bind(self, allow_mismatch: bool) -> None:
        assert self.pack is not None
        target = load_target(self.pack.target["name"], self.pack.target.get("backend"))
        self.backend = get_backend(target)
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
        self._cover_rest()

    def _cover_rest(self) -> None:
        """Run what the pack does not cover in the backend's own runtime: each stretch of
        consecutive uncovered nodes as one piece where the backend can (glue and untuned tasks
        together), else each untuned task with the backend's baseline op, else the executor."""
        assert self.backend is not None
        covered = {node.name for bound in self.kernels for node in bound.task.nodes}
        in_pieces: set[str] = set()
        stretch: list[Node] = []
        for node in [*self.graph.nodes, None]:
            if node is not None and node.name not in covered:
                stretch.append(node)
                continue
            if stretch and self._add_piece(stretch):
                in_pieces.update(n.name for n in stretch)
            stretch = []
        for task, _ in self.fallbacks:
            if not all(node.name in in_pieces for node in task.nodes):
                baseline = self.backend.baseline(task)
                if baseline is not None:
                    self.baselines.append(BoundKernel(task, baseline, None))

    def _add_piece(self, stretch: list[Node]) -> bool:
        assert self.backend is not None
        graph = self.graph
        names = {node.name for node in stretch}
        produced = [value for node in stretch for value in node.outputs if value]
        consumers = self._consumers
        inputs = list(dict.fromkeys(value for node in stretch for value in node.inputs
                                    if value and value not in produced and value not in graph.constants))
        outputs = [value for value in produced if value in graph.outputs
                   or any(user.name not in names for user in consumers.get(value, []))]
        if not outputs:
            return False
        piece = self.backend.host_baseline(stretch, {v: graph.values[v] for v in inputs},
                                           {v: graph.values[v] for v in outputs}, graph.constants, graph.opset)
        if piece is None:
            return False
        self.pieces.append((stretch, piece))
        return True

    def _overrides(self) -> dict[str, Callable[[dict[str, np.ndarray]], None]]:
        assert self.backend is not None
        backend = self.backend
        overrides: dict[str, Callable[[dict[str, np.ndarray]], None]] = {}
        for bound in [*self.kernels, *self.baselines]:
            task, program = bound.task, bound.program
            for node in task.nodes[:-1]:
                overrides[node.name] = _skip

            def run_kernel(env: dict[str, np.ndarray], task: Task = task, program: Program = program) -> None:
                inputs = [self._buffer(name, env, task) for name in task.input_names]
                if backend.host_memory:  # the kernel writes straight into the arrays the graph reads
                    arrays = [aligned_empty(spec) for spec in task.outputs]
                    program(inputs, [backend.view(a) for a in arrays])
                    env.update(zip(task.output_names, arrays))
                    return
                outputs = [backend.empty(spec, 0) for spec in task.outputs]
                program(inputs, outputs)
                backend.synchronize()
                for name, buffer in zip(task.output_names, outputs):
                    env[name] = backend.to_host(buffer)
            overrides[task.nodes[-1].name] = run_kernel
        for stretch, piece in self.pieces:
            for node in stretch[:-1]:
                overrides[node.name] = _skip

            def run_piece(env: dict[str, np.ndarray], piece: Callable[..., dict[str, np.ndarray]] = piece) -> None:
                env.update(piece(env))
            overrides[stretch[-1].name] = run_piece
        return overrides

    def _buffer(self, name: str, env: dict[str, np.ndarray], task: Task) -> Any:
        assert self.backend is not None
        constant = task.constants.get(name)
        if constant is None:
            constant = self.graph.constants.get(name)
        if constant is not None:  # weights move to the device once
            key = (task.nodes[-1].name, name)  # node names are unique in a graph
            if key not in self._constant_buffers:
                self._constant_buffers[key] = self.backend.to_device(constant)
            return self._constant_buffers[key]
        return self.backend.view(env[name])

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_graph(self.graph, dict(feeds), self._overrides() if self.backend is not None else None)

    def latency(self, feeds: Mapping[str, np.ndarray], repeats: int = 10, warmup: int = 2) -> list[float]:
        """Seconds per whole-model run (host clock, outputs on the host)."""
        for _ in range(warmup):
            self.run(feeds)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.run(feeds)
            times.append(time.perf_counter() - start)
        return times


def _skip(env: dict[str, np.ndarray]) -> None:
    """A node fused into a kernel that runs at the group's last node."""


def _file_hash(model: str | Path | bytes) -> str:
    import hashlib

    data = model if isinstance(model, bytes) else Path(model).read_bytes()
    return hashlib.sha256(data).hexdigest()
