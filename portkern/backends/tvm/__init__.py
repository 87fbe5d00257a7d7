"""The TVM backend: schedule templates built with LLVM for the host CPU, or as CUDA for NVIDIA GPUs.

Each task kind has template modules (gemm.py, conv2d.py, ...): a TE computation plus a schedule
whose knobs form the variant's space. The CUDA family (cuda/) schedules the same computations for
GPU threads; a target's hwprofile kind picks the family (`--target h200 --backend tvm`).

CPU: compile = schedule -> tvm.compile -> export_library; the artifact carries the shared
library's bytes and the lowered TensorIR as its readable source, so a pack reloads a kernel with no
TVM schedule code involved. The baseline is onnxruntime on the task's own subgraph, run on the same
buffers by pointer (ort_subgraph.OrtProgram).

CUDA: compile works without a GPU (cuda/build.py): the artifact is a bundle of the loadable
library, the generated CUDA (its readable source) and, where nvcc or NVRTC is found, PTX and
ptxas's resource report. load, buffers and timing need TVM's CUDA runtime and a device; without
them they raise CudaRuntimeUnavailable ("TVM's CUDA runtime is not available here: ..."), which
the search records as the trial's outcome. There is no baseline on the GPU (onnxruntime reads
host memory); runs are timed with the host clock around a device synchronization, since TVM gives
Python no CUDA events.
"""
from __future__ import annotations

import inspect
import logging
import os
import platform
import tempfile
import time
import types
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm_ffi import get_global_func

from ...hwprofile import Target
from ...ir import Graph, Node, TensorSpec
from ...models import random_feeds
from ...ort_subgraph import OrtGraphPiece, OrtProgram, OrtSubgraphError, node_seconds, subgraph_model
from ...tasks import Task
from ..base import (HOST_BUFFER_ALIGNMENT, Artifact, Backend, Candidate, CompileError, Program, StretchPiece,
                    Variant)
from . import attention, conv2d, elementwise, gemm, global_pool, groupnorm, inline, layernorm, pool, rmsnorm, softmax
from .common import nearest_valid
from .cuda import TEMPLATES as CUDA_TEMPLATES
from .cuda import build as cuda_build
from .program import TvmProgram

log = logging.getLogger("portkern.tvm")

TEMPLATES: dict[str, tuple[types.ModuleType, ...]] = {
    "gemm": (gemm,),
    "conv2d": (conv2d,),
    "softmax": (softmax,),
    "layernorm": (layernorm,),
    "rmsnorm": (rmsnorm,),
    "groupnorm": (groupnorm,),
    "pool": (pool, global_pool),
    "attention": (attention,),
    "elementwise": (elementwise,),
}

# read once at import: a variant's source is what this process's template actually is
SOURCES: dict[types.ModuleType, str] = {
    t: inspect.getsource(t) for family in (TEMPLATES, CUDA_TEMPLATES) for ts in family.values() for t in ts}


def _variant_name(template: types.ModuleType) -> str:
    """tvm_gemm for the CPU family's gemm.py, tvm_cuda_gemm for cuda/gemm.py."""
    return "tvm_" + template.__name__.removeprefix(f"{__name__}.").replace(".", "_")


# runtime.config_threadpool's AffinityMode: every worker (and the calling thread) may run on any
# listed CPU (kSpecifyThreadShareAllCore); -2 (kSpecifyOneCorePerThread) pins worker i to the
# (i+1)-th listed CPU instead, the calling thread running task 0 wherever it is
_THREADS_SHARE_CORES = -3
# sched_yield rounds a TVM pool worker waits for the next parallel loop before it sleeps (~0.7 us
# each on the 2-core host: ~90 us). TVM's default, 300000, kept the worker busy ~200 ms after
# every kernel on its pinned core, where onnxruntime's threads then ran the model's next stretch:
# two kept kernels made the demo BERT 2x slower (benchmarks/cpu/split_cost_probe.py).
POOL_SPIN_COUNT = 128
IN_MODEL_RUNS = 20  # profiled whole-model runs (after as many warm-up runs) for baseline_in_model


CONTRACTIONS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})


def in_model_nodes(task: Task, seconds: Mapping[str, float]) -> set[str]:
    """The names in onnxruntime's profile (`seconds`) that hold the task's nodes, or none where
    some of its work cannot be found there. onnxruntime's profile names a node as the graph did,
    or a fusion after the node it started from ("<MatMul>/MatMulAddFusion"), or a chain it re-laid
    out (NCHWc) after the chain's last output. Each contraction (MatMul, Conv) must be found unless
    the task's output names a chain: a time without the contraction (only a residual Add found,
    the MatMul inside a fusion named otherwise) would be a baseline far too fast to beat."""
    found: set[str] = set()
    missing_contraction = False
    for node in task.nodes:
        own = {name for name in (node.name, *node.outputs) if name in seconds}
        own.update(name for name in seconds if name.startswith(f"{node.name}/"))
        found |= own
        missing_contraction |= node.op_type in CONTRACTIONS and not own
    chain_named = any(name in seconds for name in task.nodes[-1].outputs)
    return found if found and (chain_named or not missing_contraction) else set()


def _use_cores(cores: int) -> None:
    """Run parallel loops on exactly `cores` threads (the calling thread and `cores - 1` TVM
    workers), every one free to run on any CPU this process may use, whose workers sleep soon after
    a kernel (POOL_SPIN_COUNT) unless TVM_THREAD_POOL_SPIN_COUNT says otherwise. TVM reads that
    once, when its first worker starts: a process that ran a parallel TVM loop before any
    TvmBackend existed keeps the spin count (and the one-thread pool) it started with.

    TVM's default halves the logical CPU count on x86 (it assumes hyper-threads), so on a 2-core
    host every parallel loop would run on one thread. Workers are not pinned (they were, one per
    CPU, until 2026-12-04): a pinned worker waits out whatever else runs on its CPU, and each
    parallel kernel waits for it. Measured on the 2-core EPYC VM (benchmarks/cpu/
    pool_affinity_probe.py, one process, placements in alternating rounds, default configs): with a
    busy thread on CPU 1 (there onnxruntime's default session pins its worker, which spins ~50 ms
    after a run), a 128x256 LayerNorm took median 3.7 ms with the worker pinned to CPU 1 vs 0.04 ms
    free (p10 3.6 vs 0.015), a 128x1024x256 GEMM 7.7 vs 3.7 ms (p10 3.7 vs 0.69), a 64-channel 3x3
    conv at 56x56 13.0 vs 7.2 ms (p10 8.7 vs 2.6); without that thread the two agree within noise
    (round-by-round ratio free/pinned: GEMM and conv 0.98-1.01, LayerNorm 0.92-1.1). Pinning the
    calling thread away from the worker wins only back to back (LayerNorm 7 vs 12 us) and loses
    when the worker sleeps between kernels, as in a model (30-39 vs 25 us: a cross-CPU wake-up).
    """
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(POOL_SPIN_COUNT))
    cpus = sorted(os.sched_getaffinity(0))[:cores] if hasattr(os, "sched_getaffinity") else list(range(cores))
    get_global_func("runtime.config_threadpool")(_THREADS_SHARE_CORES, len(cpus), [str(c) for c in cpus])


def _host_cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class TvmBackend(Backend):
    """LLVM CPU kernels, or CUDA kernels, from parametric TVM schedules."""

    name = "tvm"
    device_kinds = frozenset({"cpu", "cuda"})
    host_memory = True

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        # a CUDA target: the CUDA family, built here, run only where TVM's CUDA runtime is
        # (unlike TritonBackend.on_gpu, which says a device is present)
        self.gpu_target = target.profile.kind == "cuda"
        self.templates = CUDA_TEMPLATES if self.gpu_target else TEMPLATES
        if self.gpu_target:
            self.device = tvm.cuda(0)
            self.host_memory = False  # device buffers: the runtime copies results to the host
        else:
            self.device = tvm.cpu(0)
            _use_cores(target.profile.cores)
        self._by_source = {SOURCES[t]: t for ts in self.templates.values() for t in ts}

    @cached_property
    def llvm_target(self) -> tvm.target.Target:
        """LLVM for this very CPU (its -mcpu), with the hwprofile's core count."""
        host_cpu = get_global_func("tvm.codegen.llvm.GetHostCPUName")()
        return tvm.target.Target({"kind": "llvm", "mcpu": host_cpu, "num-cores": self.target.profile.cores})

    @cached_property
    def cuda_target(self) -> tvm.target.Target:
        return cuda_build.cuda_target(self.target.profile)

    # --- kernels ---------------------------------------------------------------------------
    def variants(self, task: Task) -> list[Variant]:
        found = []
        for template in self.templates.get(task.kind, ()):
            def valid(config: dict[str, Any], template: types.ModuleType = template) -> bool:
                return template.constraints(task, config, self.target) is None

            default = nearest_valid(template.DEFAULT, template.SPACE, valid)
            if default is None:
                continue
            found.append(Variant(
                name=_variant_name(template), kind=task.kind, backend=self.name,
                source=SOURCES[template],
                space={k: tuple(v) for k, v in template.SPACE.items()}, default=default,
                precision=template.PRECISION))
        return found

    def _template(self, variant: Variant) -> types.ModuleType:
        template = self._by_source.get(variant.source)
        if template is None:
            names = ", ".join(_variant_name(t) for t in self._by_source.values())
            raise CompileError(f"variant {variant.name}: the TVM backend builds only its own templates "
                               f"for {self.target.name} ({names})")
        return template

    def check(self, candidate: Candidate, task: Task) -> str | None:
        try:
            template = self._template(candidate.variant)
        except CompileError as exc:
            return str(exc)
        if template.KIND != task.kind:
            return f"{candidate.variant.name} implements {template.KIND}, not {task.kind}"
        return template.constraints(task, candidate.params, self.target)

    def compile(self, candidate: Candidate, task: Task) -> Artifact:
        reason = self.check(candidate, task)
        if reason:
            raise CompileError(reason)
        template = self._template(candidate.variant)
        start = time.perf_counter()
        try:
            kernel = template.schedule(task, candidate.params, self.target)
            scheduled = time.perf_counter()
            if self.gpu_target:
                binary, source, meta = cuda_build.build(kernel, self.cuda_target)
                return Artifact(backend=self.name, variant=candidate.variant.name, config=candidate.params,
                                source=source, binary=binary, binary_name=cuda_build.BUNDLE_NAME,
                                meta={**meta, "schedule_s": scheduled - start})
            executable = tvm.compile(kernel.module, target=self.llvm_target)
            with tempfile.TemporaryDirectory(prefix="portkern_tvm_") as scratch:
                path = Path(scratch) / "kernel.so"
                executable.export_library(str(path))
                binary = path.read_bytes()
        except CompileError:
            raise
        except Exception as exc:  # TVM raises its own error types: they are this trial's evidence
            raise CompileError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}") from None
        finished = time.perf_counter()
        return Artifact(
            backend=self.name, variant=candidate.variant.name, config=candidate.params,
            source=kernel.module.script(), binary=binary, binary_name="kernel.so",
            meta={"arg_shapes": [list(s) for s in kernel.arg_shapes],
                  "schedule_s": scheduled - start, "compile_s": finished - start,
                  "llvm_target": str(self.llvm_target)},
        )

    def load(self, artifact: Artifact, task: Task) -> Program:
        if not artifact.binary:
            raise CompileError(f"artifact of {artifact.variant} has no shared library")
        if self.gpu_target:
            cuda_build.require_runtime(self.device)
        library = cuda_build.library(artifact.binary) if self.gpu_target else artifact.binary
        with tempfile.TemporaryDirectory(prefix="portkern_tvm_") as scratch:
            path = Path(scratch) / "kernel.so"
            path.write_bytes(library)
            module = tvm.runtime.load_module(str(path))  # dlopen'd: the file may go once loaded
        return TvmProgram(module["main"], artifact.meta["arg_shapes"])

    def baseline(self, task: Task) -> Program | None:
        """onnxruntime on the task's subgraph, reading and writing these TVM tensors in place;
        none on a GPU (onnxruntime would read device memory as host memory)."""
        if self.gpu_target:
            return None
        try:
            return OrtProgram(task, threads=self.target.profile.cores)
        except OrtSubgraphError:
            return None

    def stretch_runner(self, nodes: Sequence[Node], inputs: Mapping[str, TensorSpec],
                       outputs: Mapping[str, TensorSpec], constants: Mapping[str, np.ndarray],
                       opset: int, source: str | Path | bytes | None = None) -> StretchPiece | None:
        """onnxruntime on the stretch, as one session, on host arrays."""
        try:
            model = source if source is not None else subgraph_model(nodes, inputs, outputs, constants, opset,
                                                                     f"portkern_{nodes[0].name}")
            # the whole model in one session: nothing of portkern's runs between its runs
            return StretchPiece(OrtGraphPiece(model, threads=self.target.profile.cores, stop_spinning=source is None))
        except OrtSubgraphError:
            return None

    def baseline_in_model(self, graph: Graph, tasks: Sequence[Task],
                          source: str | Path | bytes | None = None) -> dict[str, float] | None:
        """onnxruntime's profiler on the whole model: a task's time is that of its nodes found
        (in_model_nodes; a node fused into one of them counts in the survivor's time). Measured on
        the Xeon VM, bert-mini (benchmarks/cpu/in_model_profile.py): a 256x256 GEMM with bias 75 us
        in the model vs 167 us alone, LayerNorm 23 vs 62, attention 109 vs 184; resnet50's
        64-channel 3x3 conv 0.66 ms (its NCHWc chain) vs 1.2 ms alone."""
        if self.gpu_target:
            return None
        try:
            model = inline.named_model(graph, source)
            seconds = node_seconds(model, random_feeds(graph, seed=7), runs=IN_MODEL_RUNS,
                                   threads=self.target.profile.cores)
        except Exception as exc:  # onnxruntime's own errors: the tasks keep their baselines alone
            log.warning("no in-model baseline: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return None
        per_key: dict[str, list[float]] = {}
        for task in tasks:
            found = in_model_nodes(task, seconds)
            if found:
                per_key.setdefault(task.key, []).append(sum(seconds[name] for name in found))
        return {key: float(np.median(times)) for key, times in per_key.items()}

    def graph_runner(self, graph: Graph, kernels: Sequence[tuple[Task, Artifact]],
                     source: str | Path | bytes | None = None) -> StretchPiece | None:
        """The whole model in one onnxruntime session, each kernel a custom-op node in it
        (inline.py); None on a GPU, or where the op cannot host a kernel here (said in the log)."""
        if self.gpu_target or not kernels:
            return None
        threads = self.target.profile.cores
        try:
            model = inline.inline_model(graph, kernels, threads, source)
            return StretchPiece(OrtGraphPiece(model, threads=threads, stop_spinning=False,
                                              custom_ops=inline.op_library()))
        except (inline.InlineUnavailable, OrtSubgraphError) as exc:
            log.warning("kernels run between onnxruntime sessions, not inside one: %s", exc)
            return None

    # --- buffers: TVM tensors on the host, or on the GPU ---------------------------------------
    def to_device(self, array: np.ndarray) -> Any:
        if self.gpu_target:
            cuda_build.require_runtime(self.device)
        return tvm.runtime.tensor(np.ascontiguousarray(array), self.device)

    def to_host(self, buffer: Any) -> np.ndarray:
        return buffer.numpy()

    def view(self, array: np.ndarray) -> Any:
        array = np.ascontiguousarray(array)
        # TVM takes only 64-byte aligned host memory zero-copy; a GPU buffer is always a copy
        if self.gpu_target or array.ctypes.data % HOST_BUFFER_ALIGNMENT:
            return self.to_device(array)
        return tvm.runtime.from_dlpack(array)

    def empty(self, spec: TensorSpec, fill: float) -> Any:
        return self.to_device(np.full(spec.shape, fill, dtype=spec.dtype))

    def copy_into(self, buffer: Any, array: np.ndarray) -> None:
        buffer.copyfrom(np.ascontiguousarray(array, dtype=buffer.dtype))

    def synchronize(self) -> None:
        if self.gpu_target:
            cuda_build.require_runtime(self.device)
            self.device.sync()

    @property
    def timing_method(self) -> str:
        if self.gpu_target:
            return ("host clock around one launch, the device synchronized before and after "
                    "(TVM gives Python no CUDA events): launch cost included")
        return super().timing_method

    # --- identity ------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, str]:
        if self.gpu_target:
            return {**super().fingerprint(), "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__,
                    "cuda_target": str(self.cuda_target),
                    "ptx_compiler": cuda_build.ptx_compiler() or "none",
                    "device": self.device.device_name if self.device.exist else "none"}
        return {
            **super().fingerprint(),
            "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__,
            "llvm": str(tvm.target.codegen.llvm_version_major()), "llvm_target": str(self.llvm_target),
            "cpu": _host_cpu_model(), "cores": str(self.target.profile.cores),
        }
