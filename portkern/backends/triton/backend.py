"""The Triton backend: CUDA GPUs for real, the Triton interpreter on CPU, cross-compiles for both.

Kernel modules (kernel_module.py's contract) for this backend:
  - import only triton, triton.language, triton.tools.tensor_descriptor (TMA descriptors) and math;
    `launch(task, config, inputs, outputs)` receives torch tensors but never imports torch: it
    reads .shape, .stride(), .dtype, .data_ptr() and launches module-level @triton.jit functions
    as `kernel[grid](...)`. Inputs come in the task's order (tasks.py), outputs are preallocated
    by the harness and must be fully written.
  - or Gluon (triton.experimental.gluon and its Hopper modules: layouts, shared memory, TMA and
    asynchronous wgmma by hand) with @gluon.jit functions, for what plain Triton cannot express;
    the interpreter cannot run Gluon, so such a module sets `NEEDS_GPU = "<why>"`: without a GPU
    it is cross-compiled, never run.
  - optional `scratch(task, config) -> [(shape, dtype), ...]`: workspace the backend allocates once
    per loaded program and appends after the outputs (launch may not allocate; this is how a
    deterministic split-K keeps its partial sums without atomics).
  - optional `shared_memory(task, config) -> int`: bytes of shared memory per program, checked
    against the target; without it, configs with BLOCK_M/BLOCK_N/BLOCK_K are estimated as
    num_stages x (A tile + B tile).
  - nothing else: compile_for records the launches `launch` makes on meta tensors to learn each
    kernel's signature and constexprs (compile_only.py), so no separate spec function exists to
    drift from the code that really runs.
  - built-in files may share device code with `# include: NAME` (modules.py); the include is
    expanded into Variant.source, so a variant is always one self-contained text.
  - PRECISION is what the arithmetic promises ('fp32': exact fp32 products and fp32 accumulation,
    'tf32': fp32 inputs through tf32 tensor cores); on fp16/bf16 data the gate applies the looser
    of PRECISION and the data type (verify.tolerance_for).

Devices: with a CUDA (or ROCm) torch, buffers are device tensors, compile() runs the candidate
once so Triton's JIT builds it for the real shapes (binary and the driver's register/spill count
go into the Artifact), and time_once uses CUDA events behind a spin kernel (device time, launch
cost excluded). Without one, kernels run in the Triton interpreter on CPU tensors (fp32/fp16: its
bf16 tl.dot is wrong, so bf16 tasks are refused), and compile() cross-compiles for the target's
arch (sm_90, sm_80, gfx942) so compiler errors and resource use are still real. load()
executes the source again (Triton's JIT rebuilds or finds the same binary in its cache); the
Artifact's binary is the evidence a pack keeps.

variants(task) offers a variant of the task's kind (for elementwise, the kernel codegen.py
generates for the task's expression) when its DEFAULT config, or one that differs from it in a
single parameter, passes check(): the search then starts from a valid point, and a variant that
cannot serve the task (a GEMV for a large M) is not offered at all.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import triton

from ...errors import PortkernError
from ...hwprofile import HwProfile, Target
from ...ir import Node, TensorSpec
from ...tasks import Task, upcast_float
from ..base import Artifact, Backend, Candidate, CompileError, Program, StretchPiece, Variant
from ..kernel_module import KernelSourceError, narrowed, variant_from_source
from . import baselines, codegen, glue
from .compile_only import ARCH_TARGETS, bundle, compile_for, compiler_message, kernel_report, summarize
from .modules import (ALLOWED_IMPORTS, BACKEND_NAME, builtin_variants, interpreted_language, kernel_module,
                      record_launches, scratch_specs, torch_dtype)

INTERPRETER_BF16 = "bfloat16 needs a GPU: the Triton interpreter's bf16 tl.dot gives wrong results"
_MAX_WARPS = 32
_MAX_SPIN_CYCLES = 1 << 32


class InterpreterLimitError(PortkernError):
    """The Triton interpreter (no GPU here) cannot run this task correctly."""


@dataclass
class _TritonProgram:
    """A loaded candidate: its module's launch with the task, config and workspace bound."""

    module: Any
    task: Task
    config: dict[str, Any]
    scratch: list[torch.Tensor]
    interpret: bool

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        with interpreted_language() if self.interpret else contextlib.nullcontext():
            self.module.launch(self.task, self.config, list(inputs), [*outputs, *self.scratch])


@dataclass
class _TorchProgram:
    """A baseline: one torch eager expression. The gate has it write a preallocated output; a
    run takes the tensor torch made (`produce`), saving a copy per call (ResNet-50's 42 baseline
    convs copied 0.19 ms a run on the H200)."""

    compute: Callable[[Sequence[torch.Tensor]], torch.Tensor]
    output: TensorSpec

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        outputs[0].copy_(self.compute(inputs))

    def produce(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        result = self.compute(inputs)
        dtype = torch_dtype(self.output.dtype)
        if tuple(result.shape) != self.output.shape or result.dtype != dtype:  # broadcast or cast, as copy_ does
            return [torch.empty(self.output.shape, dtype=dtype, device=result.device).copy_(result)]
        return [result.contiguous()]  # the kernels after it read dense buffers


class TritonBackend(Backend):
    name = BACKEND_NAME
    device_kinds = frozenset({"cuda", "hip"})
    allowed_imports = ALLOWED_IMPORTS
    folds_attention_transposes = True
    shares_kv_heads = True
    fuses_rotary = True
    scales_conv_inputs = True
    conv_layout = "NHWC"  # tensor cores read contiguous channels; cuDNN runs NHWC without transposes

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.on_gpu = torch.cuda.is_available()
        self.interprets_kernels = not self.on_gpu
        self.device = torch.device("cuda" if self.on_gpu else "cpu")
        self._spin_cycles = 200_000  # ~100 us at 2 GHz; grows if a run takes longer to enqueue
        self._seconds_per_spin_cycle: float | None = None

    # --- kernels ---------------------------------------------------------------------------
    def variants(self, task: Task, runnable_here: bool = True) -> list[Variant]:
        """Built-in variants of the task's kind, plus the generated one for an elementwise chain.
        runnable_here=False: every one the target offers, those this machine cannot run too (to
        cross-compile them)."""
        found = [v for v in _library() if v.kind == task.kind]
        if task.kind == "elementwise":
            try:
                found += codegen.elementwise_variants(task)
            except codegen.ExprError:
                pass  # a step the generator does not know: no generated variant, the baseline runs
        valid = self.check if runnable_here else self.target_problem
        found = [self.for_task(v, task) for v in found]
        return [v for v in found if any(valid(Candidate.of(v, config), task) is None
                                        for config in _default_and_neighbours(v))]

    def for_task(self, variant: Variant, task: Task) -> Variant:
        return narrowed(variant, lambda v: kernel_module(v, interpret=not self.on_gpu), task, self.target)

    def check(self, candidate: Candidate, task: Task) -> str | None:
        reason = self.target_problem(candidate, task)
        if reason is None and not self.on_gpu:
            reason = _interpreter_problem(kernel_module(candidate.variant, interpret=True), task)
        return reason

    def target_problem(self, candidate: Candidate, task: Task) -> str | None:
        """Why this configuration cannot work on the target, or None: check() without this machine's
        limits (no GPU here: the interpreter), which is what cross-compiling it needs."""
        variant, config = candidate.variant, candidate.params
        if set(config) != set(variant.space):
            return f"config parameters {sorted(config)} differ from the variant's {sorted(variant.space)}"
        reason = _launch_option_problem(config, self.target.profile)
        if reason:
            return reason
        try:
            module = kernel_module(variant, interpret=not self.on_gpu)
        except KernelSourceError as exc:
            return f"invalid kernel module: {exc}"
        except Exception as exc:
            return f"kernel module failed to load: {type(exc).__name__}: {exc}"
        try:
            shared = (module.shared_memory(task, config) if hasattr(module, "shared_memory")
                      else _tile_bytes_estimate(task, config))
            limit = self.target.profile.limits.get("shared_mem_per_block")
            if limit is not None and shared > limit:
                return f"needs ~{shared} B of shared memory per program > the target's {int(limit)} B"
            return module.constraints(task, config, self.target)
        except Exception as exc:  # a proposer's constraints can be wrong too: that is a finding
            return f"constraints() raised {type(exc).__name__}: {exc}"

    def compile(self, candidate: Candidate, task: Task) -> Artifact:
        reason = self.check(candidate, task)
        if reason:
            raise CompileError(f"invalid configuration: {reason}")
        start = time.perf_counter()
        arch = self.target.profile.arch
        if self.on_gpu:
            kernels = self._jit_compile(candidate, task)
            mode = f"jit on {torch.cuda.get_device_name()}"
        elif arch in ARCH_TARGETS:
            kernels = compile_for(candidate, task, arch)["kernels"]
            mode = f"cross-compiled for {arch}; runs in the Triton interpreter here"
        else:
            raise CompileError(f"no GPU here and no cross-compiler for arch '{arch}'")
        meta: dict[str, Any] = {
            "mode": mode, "arch": arch, "compile_s": time.perf_counter() - start,
            **summarize(kernels),
            "kernels": [{k: v for k, v in kernel.items() if k != "asm"} for kernel in kernels],
        }
        return Artifact(backend=self.name, variant=candidate.variant.name, config=candidate.params,
                        source=candidate.variant.source, binary=bundle(kernels),
                        binary_name="kernels.zip", meta=meta)

    def _jit_compile(self, candidate: Candidate, task: Task) -> list[dict[str, Any]]:
        """Triton's JIT builds the candidate for the real shapes: by running it once on random
        data, or, where compiling may not launch (compile_launches False), by its warm-up on
        unwritten buffers, which compiles into the on-disk cache the measuring process reads."""
        module = kernel_module(candidate.variant, interpret=False)
        config = candidate.params
        specs = [*task.inputs, *task.outputs, *scratch_specs(module, task, config)]
        if self.compile_launches:
            buffers = [self._random(spec) for spec in task.inputs]
            buffers += [self.empty(spec, 0.0) for spec in specs[len(task.inputs):]]
        else:  # torch.empty allocates without a kernel
            buffers = [torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=self.device) for spec in specs]
        inputs, outputs = buffers[:len(task.inputs)], buffers[len(task.inputs):]
        try:
            launches = record_launches(module, lambda: module.launch(task, config, inputs, outputs),
                                       mode="run" if self.compile_launches else "build")
            for launch in launches:  # a warm-up leaves the binary unloaded: load it (checks the
                launch.compiled._init_handles()  # shared memory and threads, reads registers), no launch
            self.synchronize()
        except Exception as exc:
            raise CompileError(compiler_message(exc)) from None
        if not launches:
            raise CompileError("launch() launched no @triton.jit kernel of its module")
        return [kernel_report(launch, launch.compiled, launch.compiled.metadata.target.backend,
                              from_driver=True) for launch in launches]

    def load(self, artifact: Artifact, task: Task) -> Program:
        try:
            variant = variant_from_source(artifact.variant, artifact.source, self.name, "artifact",
                                          ALLOWED_IMPORTS)
            module = kernel_module(variant, interpret=not self.on_gpu)
        except KernelSourceError as exc:
            raise CompileError(str(exc)) from None
        limit = None if self.on_gpu else _interpreter_problem(module, task)
        if limit:
            raise InterpreterLimitError(limit)
        scratch = [self.empty(spec, float("nan")) for spec in scratch_specs(module, task, artifact.config)]
        return _TritonProgram(module, task, dict(artifact.config), scratch, interpret=not self.on_gpu)

    def baseline(self, task: Task) -> Program | None:
        compute = baselines.for_task(task)
        return None if compute is None else _TorchProgram(compute, task.outputs[0])

    stretches_span_tasks = False  # untuned tasks run on their torch baseline; glue.py runs what lies between

    def stretch_runner(self, nodes: Sequence[Node], inputs: Mapping[str, TensorSpec],
                       outputs: Mapping[str, TensorSpec], constants: Mapping[str, np.ndarray],
                       opset: int, source: str | Path | bytes | None = None) -> StretchPiece:
        """The glue between tasks as torch ops on the device (glue.py); a node it does not cover
        runs in the numpy executor on the host, listed on the piece."""
        return glue.stretch_piece(self, nodes, list(inputs), list(outputs), constants, opset)

    def reference(self, task: Task, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The subgraph as device glue in float64: the same ONNX semantics as the executor (glue.py
        is tested against it op by op), computed by cuBLAS/cuDNN in double precision; a node glue
        does not cover runs in the executor, as in the runtime."""
        constants = {name: upcast_float(value) for name, value in task.constants.items()}
        piece = glue.stretch_piece(self, task.reference_nodes, task.input_names, task.output_names, constants,
                                   task.opset)
        def widened(value: np.ndarray) -> torch.Tensor:
            # uploaded in its own dtype and widened on the device: a float16 array widened on the
            # host first moves 4x the bytes, and the host's cast cost the gate ~0.4 s per input set
            # of a 2048x5632x2048 GEMM
            tensor = self.to_device(value)
            return tensor.double() if tensor.is_floating_point() else tensor
        values = piece.run({name: widened(value) for name, value in zip(task.input_names, inputs, strict=True)})
        return [self.to_host(values[name]) for name in task.output_names]

    # --- buffers -----------------------------------------------------------------------------
    def to_device(self, array: np.ndarray) -> torch.Tensor:
        """A buffer of its own. To a GPU straight from the array (a blocking copy: the array is read
        when it returns); on the CPU (the interpreter) a copy, so it never aliases the array."""
        return _host_tensor(array, copy=not self.on_gpu).to(self.device)

    def to_host(self, buffer: torch.Tensor) -> np.ndarray:
        """A host array of its own. From a GPU: one copy into page-locked memory (about 3x the
        bandwidth of a pageable copy, which stages through a driver buffer), which the array
        then owns; on the CPU (the interpreter) a copy, so it never aliases the device buffer."""
        buffer = buffer.detach()
        if buffer.is_cuda:
            host = torch.empty(buffer.shape, dtype=buffer.dtype, pin_memory=True)
            host.copy_(buffer)
        else:
            host = buffer.clone(memory_format=torch.contiguous_format)
        if host.dtype == torch.bfloat16:
            import ml_dtypes

            return host.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return host.numpy()

    def empty(self, spec: TensorSpec, fill: float) -> torch.Tensor:
        return torch.full(spec.shape, fill, dtype=torch_dtype(spec.dtype), device=self.device)

    def copy_into(self, buffer: torch.Tensor, array: np.ndarray | torch.Tensor) -> None:
        """From a tensor (a feed already on the device): one copy on the device. From a host
        array: one pageable copy straight from it (no host copy first: copy_ from pageable
        memory returns when the data is read). Staging through page-locked memory measured
        slower on the H200 host (1.24 vs 0.85 ms for ResNet-50's input; host_copy_probe.py)."""
        buffer.copy_(array if isinstance(array, torch.Tensor) else _host_tensor(array, copy=False))

    def buffer_spec(self, value: Any) -> TensorSpec | None:
        if not isinstance(value, torch.Tensor):
            return None
        return TensorSpec(tuple(value.shape), str(value.dtype).removeprefix("torch."))

    def synchronize(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize()

    @property
    def timing_method(self) -> str:
        return ("CUDA events behind a spin kernel (device time, launch cost excluded)" if self.on_gpu
                else super().timing_method)

    def time_once(self, run: Callable[[], None]) -> float:
        """Device time of one run, host launch cost excluded. A spin kernel holds the stream busy
        while the host enqueues the start event, the run and the end event, so the events bracket
        device work only, as the kernel runs in a CUDA graph or behind other work (cuBLAS, torch
        and portkern kernels are timed alike). If enqueuing outlasted the spin, the device would
        have waited on the host: the spin doubles and the run is timed again."""
        if not self.on_gpu:
            return super().time_once(run)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        while True:
            torch.cuda.synchronize()
            torch.cuda._sleep(self._spin_cycles)
            start.record()
            enqueue_started = time.perf_counter()
            run()
            end.record()
            enqueued = time.perf_counter() - enqueue_started
            torch.cuda.synchronize()
            if enqueued < 0.5 * self._spin_seconds() or self._spin_cycles >= _MAX_SPIN_CYCLES:
                return start.elapsed_time(end) / 1e3
            self._spin_cycles *= 2

    def _spin_seconds(self) -> float:
        """How long the current spin holds the stream (calibrated once with events)."""
        if self._seconds_per_spin_cycle is None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            end.synchronize()
            self._seconds_per_spin_cycle = start.elapsed_time(end) / 1e3 / 1_000_000
        return self._spin_cycles * self._seconds_per_spin_cycle

    # --- identity ------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, str]:
        info = {"backend": self.name, "target": self.target.name, "triton": triton.__version__,
                "torch": torch.__version__, "python": platform.python_version()}
        if not self.on_gpu:
            return {**info, "device": "interpreter (CPU)"}
        props = torch.cuda.get_device_properties(self.device)
        return {**info, "device": props.name, "compute_capability": f"{props.major}.{props.minor}",
                "driver": _driver_version(), "cuda": str(torch.version.cuda or torch.version.hip)}

    def _random(self, spec: TensorSpec) -> torch.Tensor:
        dtype = torch_dtype(spec.dtype)
        if dtype.is_floating_point:
            return torch.randn(spec.shape, dtype=dtype, device=self.device)
        return torch.zeros(spec.shape, dtype=dtype, device=self.device)


@functools.lru_cache(maxsize=1)
def _library() -> tuple[Variant, ...]:
    return tuple(builtin_variants())


def _default_and_neighbours(variant: Variant) -> Iterator[dict[str, Any]]:
    default = dict(variant.default)
    yield default
    for name, choices in variant.space.items():
        for value in choices:
            if value != default[name]:
                yield {**default, name: value}


def _driver_version() -> str:
    """The GPU driver's version as nvidia-smi reports it (torch does not expose it)."""
    try:
        result = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else "unknown"


def _interpreter_problem(module: Any, task: Task) -> str | None:
    """Why the Triton interpreter cannot run this module on this task correctly, or None."""
    if _has_bf16(task):
        return INTERPRETER_BF16
    needs_gpu = getattr(module, "NEEDS_GPU", None)  # a module's own reason (Gluon kernels)
    return f"needs a GPU: {needs_gpu}" if needs_gpu else None


def _has_bf16(task: Task) -> bool:
    return any(spec.dtype == "bfloat16" for spec in itertools.chain(task.inputs, task.outputs))


def _launch_option_problem(config: Mapping[str, Any], profile: HwProfile) -> str | None:
    warps = config.get("num_warps")
    if warps is not None:
        if not (isinstance(warps, int) and 1 <= warps <= _MAX_WARPS and warps & (warps - 1) == 0):
            return f"num_warps={warps} must be a power of 2 in 1..{_MAX_WARPS}"
        max_threads = profile.limits.get("max_threads_per_block")
        if max_threads is not None and warps * profile.warp_size > max_threads:
            return (f"num_warps={warps} x {profile.warp_size} threads exceeds the target's "
                    f"{int(max_threads)} threads per block")
    stages = config.get("num_stages")
    if stages is not None and not (isinstance(stages, int) and stages >= 1):
        return f"num_stages={stages} must be a positive integer"
    return None


def _tile_bytes_estimate(task: Task, config: Mapping[str, Any]) -> int:
    """num_stages x (A tile + B tile) for matrix kernels; 0 when the config has no such tiles."""
    if not {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(config):
        return 0
    itemsize = np.dtype(task.dtype).itemsize if task.dtype != "bfloat16" else 2
    tile = (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * itemsize
    return int(config.get("num_stages", 1)) * tile


def _host_tensor(array: np.ndarray, copy: bool = True) -> torch.Tensor:
    """A CPU tensor over a C-contiguous copy of the array; copy=False: over the array itself
    where it is C-contiguous and writable (torch shares no read-only memory). ml_dtypes bfloat16
    goes through its bits."""
    array = np.asarray(array)
    if copy or not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array, copy=True, order="C")
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


__all__ = ["TritonBackend", "InterpreterLimitError", "INTERPRETER_BF16"]
