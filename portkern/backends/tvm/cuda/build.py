"""CUDA code generation with TVM, with or without a GPU, and the runtime check before anything runs.

TVM 0.27 generates CUDA C++ for a kernel in tvm.compile and hands it to its CUDA runtime
(libtvm_runtime_cuda, which needs the NVIDIA driver's libcuda): there the runtime compiles the
source through the `tvm_callback_cuda_compile` callback (NVRTC from the cuda-bindings package, or
nvcc with TVM_CUDA_COMPILE_MODE=nvcc). Where that runtime did not load, the codegen keeps the
source in a placeholder module instead: the exported library then carries the source, and a
machine with the runtime compiles it when it loads the library. So a CPU-only host still builds
the real artifact; it cannot run it.

Here the source is also compiled to PTX for the target's arch when nvcc (or NVRTC) is found, and
ptxas reports what the kernel really uses (registers, spills, shared memory): evidence the
search and a pack keep, not what loads on the GPU.
"""
from __future__ import annotations

import ctypes.util
import importlib.util
import io
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import tvm
from tvm.support import nvcc
from tvm_ffi import get_global_func

from ....errors import PortkernError
from ....hwprofile import HwProfile
from ...base import CompileError
from ..common import Kernel

BUNDLE_NAME = "kernel_cuda.zip"
LIBRARY = "kernel.so"  # what load() opens: host code plus the CUDA module (source, or PTX/cubin)
# a host target without -mcpu: the library's host side loads on any x86-64 GPU machine
HOST = {"kind": "llvm"}
_MESSAGE_LIMIT = 2000


class CudaRuntimeUnavailable(CompileError, PortkernError):
    """TVM here cannot load or run CUDA kernels. A CompileError: with TVM 0.27 the CUDA source is
    compiled to a device binary only when the runtime loads it, so this is where the build of a
    candidate stops on such a machine (the search records it). A PortkernError: anything that
    needs the device outside a trial (a whole-model run) stops with this one line."""


def cuda_target(profile: HwProfile) -> tvm.target.Target:
    """The TVM target for a CUDA hwprofile: its arch and per-block limits."""
    return tvm.target.Target({
        "kind": "cuda", "arch": profile.arch,
        "max_num_threads": int(profile.limit("max_threads_per_block")),
        "thread_warp_size": profile.warp_size,
        "max_shared_memory_per_block": int(profile.limit("shared_mem_per_block")),
    }, host=HOST)


def runtime_problem(device: Any) -> str | None:
    """Why CUDA kernels cannot load or run through TVM here, or None when they can."""
    if get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is None:
        driver = ctypes.util.find_library("cuda")
        why = ("the NVIDIA driver library libcuda is not installed" if driver is None
               else f"the driver library ({driver}) is present; check `ldd` on tvm/lib/libtvm_runtime_cuda.so")
        return f"this TVM did not load its CUDA runtime (libtvm_runtime_cuda): {why}"
    if not device.exist:
        return "TVM's CUDA runtime is loaded but sees no CUDA device"
    return None


def require_runtime(device: Any) -> None:
    problem = runtime_problem(device)
    if problem:
        raise CudaRuntimeUnavailable(f"TVM's CUDA runtime is not available here: {problem}")


def ptx_compiler() -> str | None:
    """What turns CUDA source into PTX here: "nvcc" on PATH, else "nvrtc" (cuda-bindings), else None."""
    if shutil.which("nvcc"):
        return "nvcc"
    if importlib.util.find_spec("cuda") and importlib.util.find_spec("cuda.bindings"):
        return "nvrtc"
    return None


def build(kernel: Kernel, target: tvm.target.Target) -> tuple[bytes, str, dict[str, Any]]:
    """The kernel as a bundle (the loadable library, its CUDA source, PTX and cubin where they
    could be made), its CUDA source, and what the compilers reported. nvcc's and ptxas's
    refusals are CompileErrors; TVM's own errors propagate as TVM raised them."""
    start = time.perf_counter()
    executable = tvm.compile(kernel.module, target=target)
    source = _cuda_source(executable.mod)
    with tempfile.TemporaryDirectory(prefix="portkern_tvm_cuda_") as scratch:
        path = Path(scratch) / LIBRARY
        executable.export_library(str(path))
        files: dict[str, bytes] = {LIBRARY: path.read_bytes(), "kernel.cu": source.encode()}
    arch = str(target.attrs["arch"])
    meta: dict[str, Any] = {
        "arch": arch, "arg_shapes": [list(shape) for shape in kernel.arg_shapes],
        "threads_per_block": launch_bounds(source), "codegen_s": time.perf_counter() - start,
    }
    compiler = ptx_compiler()
    if compiler is None:
        meta["ptx"] = "not built: neither nvcc nor NVRTC (cuda-bindings) is available here"
    else:
        files["kernel.ptx"] = _ptx(source, target, compiler)
        meta["ptx"] = f"{compiler}, {len(files['kernel.ptx'])} bytes"
        if shutil.which("ptxas"):
            files["kernel.cubin"], meta["resources"] = _assemble(files["kernel.ptx"], arch)
    meta["compile_s"] = time.perf_counter() - start
    return _bundle(files), source, meta


def library(bundle: bytes) -> bytes:
    """The loadable library inside a bundle that `build` made."""
    with zipfile.ZipFile(io.BytesIO(bundle)) as archive:
        return archive.read(LIBRARY)


def launch_bounds(source: str) -> list[int]:
    """ThreadAxes per block of each kernel in the source, as its __launch_bounds__ declare them."""
    return [int(n) for n in re.findall(r"__global__ void __launch_bounds__\((\d+)\) \w+\([^;{]*\)\s*\{", source)]


def _cuda_source(module: Any) -> str:
    """The CUDA C++ of the module tvm.compile made (its imported "cuda" module)."""
    for imported in module.imports:
        if imported.kind == "cuda":
            return imported.inspect_source("cuda") or imported.inspect_source("")
    raise CompileError("tvm.compile made no CUDA module (no kernel was bound to GPU threads?)")


def _ptx(source: str, target: tvm.target.Target, compiler: str) -> bytes:
    try:
        with target:  # TVM's compile_cuda reads the arch of the current target
            return bytes(nvcc.compile_cuda(source, target_format="ptx", arch=str(target.attrs["arch"]),
                                           compiler=compiler))
    except RuntimeError as exc:
        raise CompileError(f"{compiler} rejected the generated CUDA: {str(exc)[-_MESSAGE_LIMIT:]}") from None


def _assemble(ptx: bytes, arch: str) -> tuple[bytes, dict[str, int]]:
    """ptxas for the arch: the cubin and the resource use it reports."""
    with tempfile.TemporaryDirectory(prefix="portkern_ptxas_") as scratch:
        source, cubin = Path(scratch) / "kernel.ptx", Path(scratch) / "kernel.cubin"
        source.write_bytes(ptx)
        done = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(source), "-o", str(cubin)],
                              capture_output=True, text=True)
        if done.returncode:
            raise CompileError(f"ptxas: {(done.stderr or done.stdout).strip()[-_MESSAGE_LIMIT:]}")
        return cubin.read_bytes(), _resources(done.stderr + done.stdout)


def _resources(report: str) -> dict[str, int]:
    """The worst kernel's registers, shared memory and spilled bytes from `ptxas -v`."""
    def largest(pattern: str) -> int:
        return max((int(v) for v in re.findall(pattern, report)), default=0)

    return {"registers": largest(r"Used (\d+) registers"), "shared_bytes": largest(r"(\d+) bytes smem"),
            "spill_bytes": largest(r"(\d+) bytes spill stores") + largest(r"(\d+) bytes spill loads")}


def _bundle(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()
