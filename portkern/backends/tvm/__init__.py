"""The TVM backend: schedule templates built with LLVM for the host CPU, called on TVM tensors.

Each task kind has template modules (gemm.py, conv2d.py, ...): a TE compute plus a schedule whose
knobs form the variant's space. compile = schedule -> tvm.compile -> export_library; the artifact
carries the shared library's bytes and the lowered TensorIR as its readable source, so a pack
reloads a kernel with no TVM schedule code involved. The baseline is onnxruntime on the task's own
subgraph, run on the same buffers by pointer (ort_subgraph.OrtProgram).
"""
from __future__ import annotations

import inspect
import os
import platform
import tempfile
import time
import types
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm_ffi import get_global_func

from ...hwprofile import Target
from ...ir import Node, TensorSpec
from ...ort_subgraph import OrtGraphPiece, OrtProgram, OrtSubgraphError, subgraph_model
from ...tasks import Task
from ..base import HOST_BUFFER_ALIGNMENT, Artifact, Backend, Candidate, CompileError, Program, Variant
from . import attention, conv2d, gemm, global_pool, layernorm, pool, softmax
from .common import nearest_valid
from .program import TvmProgram

TEMPLATES: dict[str, tuple[types.ModuleType, ...]] = {
    "gemm": (gemm,),
    "conv2d": (conv2d,),
    "softmax": (softmax,),
    "layernorm": (layernorm,),
    "pool": (pool, global_pool),
    "attention": (attention,),
}

# read once at import: a variant's source is what this process's template actually is
SOURCES: dict[types.ModuleType, str] = {t: inspect.getsource(t) for ts in TEMPLATES.values() for t in ts}


def _variant_name(template: types.ModuleType) -> str:
    return f"tvm_{template.__name__.rsplit('.', 1)[-1]}"


# runtime.config_threadpool's AffinityMode: worker i pinned to the i-th listed CPU
_ONE_CORE_PER_THREAD = -2


def _use_cores(cores: int) -> None:
    """Run parallel loops on exactly `cores` threads, one per CPU this process may use.

    TVM's default halves the logical CPU count on x86 (it assumes hyper-threads), so on a 2-core
    host every parallel loop would run on one thread. Measured on this host under load, pinned
    threads (median 1.9-3.8 ms on a ResNet 3x3 conv) beat threads sharing all cores (3.9 ms).
    """
    cpus = sorted(os.sched_getaffinity(0))[:cores] if hasattr(os, "sched_getaffinity") else list(range(cores))
    get_global_func("runtime.config_threadpool")(_ONE_CORE_PER_THREAD, len(cpus), [str(c) for c in cpus])


def _host_cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class TvmBackend(Backend):
    """LLVM CPU kernels from parametric TVM schedules."""

    name = "tvm"
    device_kinds = frozenset({"cpu"})
    host_memory = True

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.device = tvm.cpu(0)
        _use_cores(target.profile.cores)
        self._by_source = {source: template for template, source in SOURCES.items()}

    @cached_property
    def llvm_target(self) -> tvm.target.Target:
        """LLVM for this very CPU (its -mcpu), with the hwprofile's core count."""
        host_cpu = get_global_func("tvm.codegen.llvm.GetHostCPUName")()
        return tvm.target.Target({"kind": "llvm", "mcpu": host_cpu, "num-cores": self.target.profile.cores})

    # --- kernels ---------------------------------------------------------------------------
    def variants(self, task: Task) -> list[Variant]:
        found = []
        for template in TEMPLATES.get(task.kind, ()):
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
            raise CompileError(f"variant {variant.name}: the TVM backend builds only its own "
                               f"templates ({', '.join(_variant_name(t) for t in self._by_source.values())})")
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
            executable = tvm.compile(kernel.module, target=self.llvm_target)
            with tempfile.TemporaryDirectory(prefix="portkern_tvm_") as scratch:
                path = Path(scratch) / "kernel.so"
                executable.export_library(str(path))
                binary = path.read_bytes()
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
        with tempfile.TemporaryDirectory(prefix="portkern_tvm_") as scratch:
            path = Path(scratch) / (artifact.binary_name or "kernel.so")
            path.write_bytes(artifact.binary)
            module = tvm.runtime.load_module(str(path))  # dlopen'd: the file may go once loaded
        return TvmProgram(module["main"], artifact.meta["arg_shapes"])

    def baseline(self, task: Task) -> Program | None:
        """onnxruntime on the task's subgraph, reading and writing these TVM tensors in place."""
        try:
            return OrtProgram(task, threads=self.target.profile.cores)
        except OrtSubgraphError:
            return None

    def host_baseline(self, nodes: Sequence[Node], inputs: Mapping[str, TensorSpec],
                      outputs: Mapping[str, TensorSpec], constants: Mapping[str, np.ndarray],
                      opset: int) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None:
        """onnxruntime on the stretch, as one session."""
        try:
            model = subgraph_model(nodes, inputs, outputs, constants, opset, f"portkern_{nodes[0].name}")
            return OrtGraphPiece(model, threads=self.target.profile.cores)
        except OrtSubgraphError:
            return None

    # --- buffers: TVM tensors on the host ----------------------------------------------------
    def to_device(self, array: np.ndarray) -> Any:
        return tvm.runtime.tensor(np.ascontiguousarray(array), self.device)

    def to_host(self, buffer: Any) -> np.ndarray:
        return buffer.numpy()

    def view(self, array: np.ndarray) -> Any:
        array = np.ascontiguousarray(array)
        if array.ctypes.data % HOST_BUFFER_ALIGNMENT:  # TVM takes only 64-byte aligned memory zero-copy
            return self.to_device(array)
        return tvm.runtime.from_dlpack(array)

    def empty(self, spec: TensorSpec, fill: float) -> Any:
        return self.to_device(np.full(spec.shape, fill, dtype=spec.dtype))

    def copy_into(self, buffer: Any, array: np.ndarray) -> None:
        buffer.copyfrom(np.ascontiguousarray(array, dtype=buffer.dtype))

    # --- identity ------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, str]:
        return {
            **super().fingerprint(),
            "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__,
            "llvm": str(tvm.target.codegen.llvm_version_major()), "llvm_target": str(self.llvm_target),
            "cpu": _host_cpu_model(), "cores": str(self.target.profile.cores),
        }
