"""Ahead-of-time compilation for a GPU that is not here: PTX + cubin (sm_90, sm_89, sm_80), HSACO (gfx942).

No separate kernel description is needed: the module's own `launch` is run on meta tensors (shapes
and strides, no memory) with its @triton.jit functions replaced by recorders (modules.record_launches),
and each recorded launch - its arguments, constexprs and num_warps/num_stages - becomes a
triton.compile(ASTSource, target=GPUTarget) call. Integer arguments and pointers are specialized the
way Triton's JIT does (divisibility by 16), so the binary is the one a GPU would build.
"""
from __future__ import annotations

import io
import re
import subprocess
import tempfile
import time
import zipfile
from typing import Any, Sequence

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from ...errors import TargetError
from ...ir import TensorSpec
from ...tasks import Task
from ..base import Candidate, CompileError
from ..kernel_module import KernelSourceError
from .modules import Launch, kernel_module, record_launches, scratch_specs, torch_dtype

ARCH_TARGETS: dict[str, GPUTarget] = {  # the archs of the shipped hwprofiles
    "sm_90": GPUTarget("cuda", 90, 32),
    "sm_89": GPUTarget("cuda", 89, 32),
    "sm_80": GPUTarget("cuda", 80, 32),
    "gfx942": GPUTarget("hip", "gfx942", 64),
}
_POINTEE = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "i1",
}
_DIVISIBILITY = 16
_MAX_MESSAGE = 4000


def meta_buffers(specs: Sequence[TensorSpec]) -> list[torch.Tensor]:
    """Tensors with shapes, strides and dtypes but no memory: enough for a launch to be recorded."""
    return [torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device="meta") for spec in specs]


def compile_for(candidate: Candidate, task: Task, arch: str) -> dict[str, Any]:
    """Compile every kernel the candidate launches for `arch`; binaries and resource report.

    Returns {"arch", "compile_s", "kernels": [{"name", "grid", "num_warps", "num_stages", "shared",
    "n_regs", "n_spills", "asm": {"ptx": str, "cubin": bytes} or {"amdgcn": str, "hsaco": bytes}}],
    "resources": {"n_regs": max, "n_spills": max, "shared": max}}. Raises CompileError.
    """
    if arch not in ARCH_TARGETS:
        raise TargetError(f"cannot cross-compile for '{arch}' (known: {', '.join(ARCH_TARGETS)})")
    start = time.perf_counter()
    launches = recorded_launches(candidate, task)
    kernels = [compile_launch(launch, ARCH_TARGETS[arch]) for launch in launches]
    return {"arch": arch, "compile_s": time.perf_counter() - start, "kernels": kernels,
            "resources": summarize(kernels)}


def recorded_launches(candidate: Candidate, task: Task) -> list[Launch]:
    """The launches `launch` makes for this task and config, recorded on meta tensors."""
    try:
        module = kernel_module(candidate.variant, interpret=False)
    except KernelSourceError as exc:
        raise CompileError(str(exc)) from None
    except Exception as exc:  # the module's own top-level code failed
        raise CompileError(f"loading the module failed: {type(exc).__name__}: {exc}") from None
    config = candidate.params
    inputs = meta_buffers(task.inputs)
    outputs = meta_buffers(task.outputs) + meta_buffers(scratch_specs(module, task, config))
    try:
        launches = record_launches(module, lambda: module.launch(task, config, inputs, outputs), mode="record")
    except Exception as exc:
        raise CompileError(f"launch() failed before any kernel ran: {type(exc).__name__}: {exc}") from None
    if not launches:
        raise CompileError("launch() launched no @triton.jit kernel of its module")
    return launches


def ast_source(launch: Launch) -> ASTSource:
    """The launch as Triton's compiler input: typed signature, constexprs, divisibility hints.

    Each argument is specialized by Triton's own JIT routine, so the binary is the one a GPU
    would build: an integer equal to 1 (a unit stride) becomes a constant, which is what lets
    the compiler see a contiguous axis and issue 16-byte loads."""
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    bound = launch.bound()
    for index, param in enumerate(launch.kernel.params):
        if param.name not in bound:
            raise CompileError(f"{launch.name}: no value for parameter '{param.name}'")
        value = bound[param.name]
        if param.is_constexpr or value is None:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
            continue
        kind, key = _specialized(value, param)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = value
        elif key == "D":
            attrs[(index,)] = [["tt.divisibility", _DIVISIBILITY]]
    source = GluonASTSource if launch.kernel.is_gluon() else ASTSource
    return source(launch.kernel, signature, constexprs=constexprs, attrs=attrs)


def _specialized(value: Any, param: Any) -> tuple[str, Any]:
    """(type, key) as the JIT specializes the argument: key 'D' marks 16-divisible values."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype") and value.dtype not in _POINTEE:
        raise CompileError(f"tensor of dtype {value.dtype} is not supported")
    if not isinstance(value, (int, float, TensorDescriptor, GluonDescriptor)) and not hasattr(value, "data_ptr"):
        raise CompileError(f"cannot pass a {type(value).__name__} to a kernel")
    return native_specialize_impl(BaseBackend, value, False, not param.do_not_specialize,
                                  not param.do_not_specialize_on_alignment)


def compile_launch(launch: Launch, target: GPUTarget) -> dict[str, Any]:
    try:
        compiled = triton.compile(ast_source(launch), target=target, options=launch.options())
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"{launch.name}: {compiler_message(exc)}") from None
    return kernel_report(launch, compiled, target.backend)


def compiler_message(exc: BaseException) -> str:
    """Triton's message with the causes it chains (the source excerpt alone names no error)."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < 4:
        parts.append(f"{type(current).__name__}: {str(current).strip()}")
        current = current.__cause__
    return "\n".join(parts)[-_MAX_MESSAGE:]


def kernel_report(launch: Launch, compiled: Any, backend: str, from_driver: bool = False) -> dict[str, Any]:
    """Resources of one compiled kernel and its binary; registers and spills come from the driver
    for a kernel loaded on a GPU (from_driver), else from the binary itself."""
    meta = compiled.metadata
    if backend == "cuda":
        asm = {"ptx": compiled.asm["ptx"], "cubin": compiled.asm["cubin"]}
        n_regs, n_spills = (compiled.n_regs, compiled.n_spills) if from_driver else _cubin_resources(asm["cubin"])
    else:
        asm = {"amdgcn": compiled.asm["amdgcn"], "hsaco": compiled.asm["hsaco"]}
        n_regs, n_spills = _amdgcn_resources(asm["amdgcn"])
    return {"name": launch.name, "grid": list(launch.grid), "num_warps": meta.num_warps,
            "num_stages": meta.num_stages, "shared": int(meta.shared), "n_regs": n_regs,
            "n_spills": n_spills, "asm": asm}


def _cubin_resources(cubin: bytes) -> tuple[int, int]:
    """Registers and spills as the driver reports them (spills = local bytes / 4, like Triton).
    The driver's local bytes include the stack frame, where ptxas puts the registers it spills:
    cuobjdump lists that as STACK, apart from LOCAL (declared local arrays)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        tool = triton.knobs.nvidia.cuobjdump.path
        text = subprocess.run([tool, "-res-usage", handle.name], capture_output=True, text=True,
                              check=True).stdout
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    local = re.search(r"LOCAL:(\d+)", text)
    if regs is None or stack is None or local is None:
        raise CompileError(f"cuobjdump gave no resource usage: {text.strip()[:200]}")
    return int(regs.group(1)), (int(stack.group(1)) + int(local.group(1))) // 4


def _amdgcn_resources(text: str) -> tuple[int, int]:
    def field(name: str) -> int:
        match = re.search(rf"\.{name}:\s+(\d+)", text)
        return int(match.group(1)) if match else 0
    return field("vgpr_count"), field("vgpr_spill_count") + field("sgpr_spill_count")


def summarize(kernels: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The candidate's worst kernel: what limits its occupancy."""
    return {key: max(int(k[key]) for k in kernels) for key in ("n_regs", "n_spills", "shared")}


def bundle(kernels: Sequence[dict[str, Any]]) -> bytes:
    """All binaries (and their assembly) of a candidate as one zip, in launch order."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for index, kernel in enumerate(kernels):
            for suffix, content in kernel["asm"].items():
                archive.writestr(f"{index}_{kernel['name']}.{suffix}", content)
    return buffer.getvalue()
