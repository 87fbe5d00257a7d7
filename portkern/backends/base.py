"""The one Backend interface, and the values that flow through it.

A backend is what a new chip needs and nothing more: the variants it offers for a task, compile a
candidate to an artifact, load an artifact as a program, and move buffers / time runs on its device.
Everything else (search, the gate, packs, the runtime) is shared.
"""
from __future__ import annotations

import hashlib
import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..executor import run_nodes
from ..hwprofile import Target
from ..ir import Graph, Node, TensorSpec
from ..tasks import Task


@dataclass(frozen=True)
class Variant:
    """A parametric kernel for one task kind: its source and the space of its parameters.

    `source` is the text of a kernel module following the backend's contract (for the source-based
    backends: KIND, PRECISION, SPACE, DEFAULT, constraints(task, config, target), and the launch
    function). It is what a pack stores and what a proposer reads and writes.
    """

    name: str
    kind: str
    backend: str
    source: str
    space: Mapping[str, tuple[Any, ...]]
    default: Mapping[str, Any]
    precision: str  # 'fp32' | 'tf32' | 'fp16' | 'bf16' ...: the accuracy the kernel promises
    origin: str = "builtin"  # builtin | rules | llm | plugin

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Candidate:
    variant: Variant
    config: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, variant: Variant, config: Mapping[str, Any]) -> "Candidate":
        return cls(variant, tuple(sorted(config.items())))

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.config)

    def key(self) -> str:
        """Same source and same config: the same kernel, never measured twice."""
        blob = json.dumps([self.variant.source_hash, self.config], default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Artifact:
    """What compile produced: a binary (where the backend has one) and what the compiler said."""

    backend: str
    variant: str
    config: dict[str, Any]
    source: str
    binary: bytes | None = None
    binary_name: str = ""  # file name in a pack, e.g. kernel.cubin, kernel.so
    meta: dict[str, Any] = field(default_factory=dict)  # registers, shared_mem, spills, compile_s


class Program(Protocol):
    """A loaded kernel: reads `inputs`, writes every element of `outputs` (device buffers)."""

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None: ...


@runtime_checkable
class ProducingProgram(Program, Protocol):
    """A program that can also hand back output buffers of its own making (a framework op that
    allocates its result): a run and the harness take them as they are, with no copy into
    preallocated outputs (under a CUDA graph, the graph's memory pool keeps their addresses).
    The gate still calls it with outputs to write, poisoned."""

    def produce(self, inputs: Sequence[Any]) -> list[Any]: ...


@dataclass
class StretchPiece:
    """A stretch of graph nodes that one call runs (Backend.stretch_runner): values by name in,
    the stretch's outputs by name out. `host_nodes` are those it sends to the reference executor
    on the host (with why), which the runtime reports: a device round trip each."""

    run: Callable[[Mapping[str, Any]], dict[str, Any]]
    host_nodes: tuple[tuple[Node, str], ...] = ()


class ExecutorStretch:
    """Nodes run by the numpy reference executor on the host, for a backend that has no runtime
    for them: inputs come through `to_host`, outputs go back through `to_device` (identities
    where the runtime's values are host arrays)."""

    def __init__(self, nodes: Sequence[Node], outputs: Sequence[str], constants: Mapping[str, np.ndarray],
                 opset: int, to_host: Callable[[Any], np.ndarray], to_device: Callable[[np.ndarray], Any]) -> None:
        produced = {value for node in nodes for value in node.outputs}
        self.nodes = list(nodes)
        self.inputs = list(dict.fromkeys(value for node in nodes for value in node.inputs
                                         if value and value not in produced))
        self.outputs = list(outputs)
        self.constants = constants
        self.opset = opset
        self.to_host, self.to_device = to_host, to_device

    def __call__(self, values: Mapping[str, Any]) -> dict[str, Any]:
        env = {name: self.constants[name] if name in self.constants else self.to_host(values[name])
               for name in self.inputs}
        run_nodes(self.nodes, env, self.opset)
        return {name: self.to_device(env[name]) for name in self.outputs}


HOST_BUFFER_ALIGNMENT = 64  # bytes; host-memory backends share arrays aligned like this


def aligned_empty(spec: TensorSpec, alignment: int = HOST_BUFFER_ALIGNMENT) -> np.ndarray:
    """An uninitialised array whose data starts on an `alignment`-byte boundary."""
    dtype = np.dtype(spec.dtype)
    raw = np.empty(spec.nbytes + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset: offset + spec.nbytes].view(dtype).reshape(spec.shape)


class Backend(ABC):
    """Compile, load, move buffers, time. One concrete class per backend module."""

    name: ClassVar[str]
    device_kinds: ClassVar[frozenset[str]]  # hwprofile kinds this backend serves
    simulated: ClassVar[bool] = False
    # kernels run in a Python interpreter (Triton's, on a host without a GPU; the simulated NPU's):
    # a run of a model-sized kernel takes seconds, so a tune bounds their trials by the trial
    # time limit only, not by the shorter limit that catches a hung kernel (--kernel-timeout)
    interprets_kernels: bool = False
    # what a kernel module of this backend may import; empty: the backend takes no source variants
    allowed_imports: ClassVar[frozenset[str]] = frozenset()
    # buffers live in host memory and view() shares it: the runtime then skips copies
    host_memory: ClassVar[bool] = False
    # attention kernels read q, k, v and write the output through strides: partition then folds
    # the head split/merge Transposes into the attention task (no copies; tasks.py, perms)
    folds_attention_transposes: ClassVar[bool] = False
    # attention kernels read one key/value head for each group of query heads (grouped-query
    # attention): partition then reads k and v before their heads are repeated (no repeated copy)
    shares_kv_heads: ClassVar[bool] = False
    # it has a rotary kernel: partition then makes transformers' rotary embedding one task (tasks.py)
    # instead of Slices, Neg and Concat in glue around an elementwise task
    fuses_rotary: ClassVar[bool] = False
    # its conv kernels scale their input per sample and channel as they load it: partition then
    # makes squeeze-excite's x * gate before a conv part of the conv task (tasks.py, input_scale)
    scales_conv_inputs: ClassVar[bool] = False
    # "NHWC": convolutions and pools want the channels innermost, and the graph is rewritten
    # channels-last before it is partitioned (layout.py; partition.backend_tasks)
    conv_layout: ClassVar[str] = "NCHW"
    # False in a compile worker: compile() must launch nothing, since another process is timing
    # a kernel on the same device (a JIT that builds on first run builds without running)
    compile_launches: bool = True

    def __init__(self, target: Target) -> None:
        self.target = target

    # --- kernels ---------------------------------------------------------------------------
    @abstractmethod
    def variants(self, task: Task) -> list[Variant]:
        """The built-in variants that implement this task on this backend (may be empty)."""

    def for_task(self, variant: Variant, task: Task) -> Variant:
        """The variant as the search draws it for this task: the source-based backends pin the
        parameters a module's fixed(task, target) decides (kernel_module.narrowed); here, as is."""
        return variant

    @abstractmethod
    def compile(self, candidate: Candidate, task: Task) -> Artifact:
        """Build a candidate; raise CompileError with the compiler's words on failure."""

    @abstractmethod
    def load(self, artifact: Artifact, task: Task) -> Program:
        """Make an artifact callable; an artifact read back from a pack loads the same way."""

    def check(self, candidate: Candidate, task: Task) -> str | None:
        """Why this configuration cannot work on the target (before compiling), or None."""
        return None

    def baseline(self, task: Task) -> Program | None:
        """The vendor/framework implementation of the task, timed by `profile`; None if none."""
        return None

    # what stretch_runner is given: True: every stretch the pack leaves uncovered, untuned tasks
    # included (a graph runtime such as onnxruntime fuses across them); False: untuned tasks run on
    # baseline(task) (the vendor's fused op: cuBLAS, SDPA, cuDNN) and stretches hold what lies between
    stretches_span_tasks: ClassVar[bool] = True

    def stretch_runner(self, nodes: Sequence[Node], inputs: Mapping[str, TensorSpec],
                       outputs: Mapping[str, TensorSpec], constants: Mapping[str, np.ndarray],
                       opset: int, source: str | Path | bytes | None = None) -> StretchPiece | None:
        """The backend's own runtime for a stretch of the model a pack does not cover: the piece
        reads the stretch's inputs by name and returns its outputs by name, as the runtime holds
        values (host arrays where `host_memory`, device buffers elsewhere). `source`, given when
        the stretch is the whole graph, is the model file itself, which a runtime may prefer to
        a rebuilt graph (the exporter's symbolic dims, the fusions its optimizer expects). None:
        not available; the runtime falls back task by task, then to the reference executor."""
        return None

    def baseline_in_model(self, graph: Graph, tasks: Sequence[Task],
                          source: str | Path | bytes | None = None) -> dict[str, float] | None:
        """Seconds per occurrence of each workload (by key) as the backend's own runtime spends
        them inside the whole model, where it can tell (a profiler): a runtime that fuses or
        re-lays out across tasks may run a task's nodes in the model much faster than their
        subgraph alone (baseline(task)). None: no such measure here."""
        return None

    def graph_runner(self, graph: Graph, kernels: Sequence[tuple[Task, Artifact]],
                     source: str | Path | bytes | None = None) -> StretchPiece | None:
        """The whole graph in the backend's own runtime with the pack's kernels called from inside
        it (onnxruntime custom ops, for TVM): no cut of that runtime's graph at each kernel.
        `source`: the model file the graph was loaded from, where there is one. None: kernels run
        as steps of their own, between stretches (stretch_runner)."""
        return None

    def reference(self, task: Task, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The task's float64 reference, its own subgraph with every float operand upcast: the
        gate's ground truth. The host executor's by default; a backend with a float64 runtime for
        the ONNX ops (Triton's device glue) may run it there, where a large conv's reference costs
        milliseconds instead of seconds of the search's time."""
        return task.reference(inputs)

    def modeled_seconds(self, program: Program) -> float | None:
        """A simulated backend's time for one run of the program (its clock); None if real."""
        return None

    def predicted_seconds(self, candidate: Candidate, task: Task) -> float | None:
        """The time a candidate will be given, known without building or running it: on a
        simulated backend its cost model (the number its trial reports, once the gate passes),
        None for a configuration check() rejects. None on real hardware: only running tells."""
        return None

    # --- buffers (default: host numpy arrays) -----------------------------------------------
    def to_device(self, array: np.ndarray) -> Any:
        return np.array(array, copy=True)

    def to_host(self, buffer: Any) -> np.ndarray:
        return np.array(buffer, copy=True)

    def empty(self, spec: TensorSpec, fill: float) -> Any:
        return np.full(spec.shape, fill, dtype=spec.dtype)

    def view(self, array: np.ndarray) -> Any:
        """The array as a buffer for the runtime's hot path: where the device is the host
        (`host_memory`), a zero-copy view sharing the array's memory when it is aligned to
        HOST_BUFFER_ALIGNMENT bytes (a copy otherwise); elsewhere a copy. The gate never uses it:
        its buffers must not share memory with what it compares against."""
        return self.to_device(array)

    def copy_into(self, buffer: Any, array: np.ndarray) -> None:
        """Write new values into an existing buffer (same address): defeats pointer caches.
        `array` may also be a buffer that `buffer_spec` recognizes (a copy on the device)."""
        np.copyto(buffer, array)

    def buffer_spec(self, value: Any) -> TensorSpec | None:
        """The shape and dtype of a value that is one of this backend's buffers (a feed already
        on the device, which a run takes without a host round trip); None for anything else."""
        return None

    def synchronize(self) -> None:
        """Wait for all work on the device (all streams)."""

    @property
    def timing_method(self) -> str:
        """How time_once takes its time, recorded with every measurement."""
        return "host clock, device synchronized before and after"

    def time_once(self, run: Callable[[], None]) -> float:
        """Seconds for one run; GPU backends use device events and leave launch cost out."""
        self.synchronize()
        start = time.perf_counter()
        run()
        self.synchronize()
        return time.perf_counter() - start

    # --- identity ------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, str]:
        """Hardware and software a pack made here depends on (device, driver, compiler versions)."""
        return {"backend": self.name, "target": self.target.name}

    def hash(self) -> str:
        blob = json.dumps(self.fingerprint(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class CompileError(Exception):
    """Raised by Backend.compile: its message is the compiler's error, stored on the trial."""
