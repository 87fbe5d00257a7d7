"""Triton kernel modules: the built-in library, loading in a chosen mode, and recording launches.

Triton decides between its interpreter and its compiler when a function is decorated with
@triton.jit: it reads TRITON_INTERPRET then (triton.knobs.runtime.interpret, in 3.6 and 3.7), not at
import. So a module's text is executed with TRITON_INTERPRET scoped to the exec, and one process can
hold both an interpreted copy (to run on CPU) and a compilable copy (to cross-compile for a GPU).

Triton's own library (tl.cdiv, tl.max, tl.sum, tl.sigmoid, x.to ... in triton/language/standard.py)
is decorated once, when triton is imported, so in a process that imported triton with the compiler
on, an interpreted kernel calling tl.max reaches a compiled JITFunction and fails. `interpreted_language`
swaps those library functions for interpreted ones for the duration of an interpreted launch.

A built-in kernel file may pull shared device code from an underscore file in kernels/ with a line
`# include: NAME` (kernels/_NAME.py). Includes are expanded when the library is read, so every
Variant.source is one self-contained text: what a pack stores and what a proposer reads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import types
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterator

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter as triton_interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from ...ir import TensorSpec
from ...tasks import Task
from ..base import Variant
from ..kernel_module import expand_includes, load_module, variant_from_source

BACKEND_NAME = "triton"
# Gluon (Triton's lower-level dialect: layouts, shared memory, asynchronous wgmma and TMA by hand) for
# kernels plain Triton cannot express; they need a GPU to run (a module says so in NEEDS_GPU)
ALLOWED_IMPORTS = frozenset({"triton", "triton.language", "triton.tools.tensor_descriptor", "math",
                             "triton.experimental", "triton.experimental.gluon",
                             "triton.experimental.gluon.language.nvidia.hopper",
                             "triton.experimental.gluon.nvidia.hopper"})
_MODE_LOCK = threading.RLock()
_MODULES: dict[tuple[str, str, bool], types.ModuleType] = {}
_MISSING = object()


def _kernel_files() -> Any:
    return resources.files("portkern.backends.triton").joinpath("kernels")


def builtin_variants() -> list[Variant]:
    """Every kernels/*.py file (not starting with '_') as a Variant; read fresh, cheap."""
    return [builtin_variant(entry.name[:-3], entry.read_text())
            for entry in sorted(_kernel_files().iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".py") and not entry.name.startswith("_")]


def builtin_variant(name: str, text: str) -> Variant:
    """A kernel file's text as the library reads it (its includes expanded from kernels/): also how
    another version of a built-in kernel (an earlier commit's, for an A/B) becomes a Variant."""
    folder = _kernel_files()

    def read(include: str) -> str:
        return str(folder.joinpath(f"_{include}.py").read_text())

    return variant_from_source(name, expand_includes(text, read), BACKEND_NAME, "builtin", ALLOWED_IMPORTS)


@contextlib.contextmanager
def _triton_mode(interpret: bool) -> Iterator[None]:
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def kernel_module(variant: Variant, interpret: bool) -> types.ModuleType:
    """The variant's module, executed once per (source, mode): Triton's JIT cache lives on it."""
    key = (variant.name, variant.source_hash, interpret)
    with _MODE_LOCK:
        module = _MODULES.get(key)
        if module is None:
            with _triton_mode(interpret):
                module = load_module(variant, ALLOWED_IMPORTS)
            _MODULES[key] = module
    return module


@functools.lru_cache(maxsize=1)
def _language_patches() -> tuple[tuple[Any, str, Any], ...]:
    """(owner, attribute, interpreted stand-in) for Triton's compiled library functions."""
    patches = []
    for name, module in list(sys.modules.items()):
        if name == "triton.language" or name.startswith("triton.language."):
            for attr, value in vars(module).items():
                if isinstance(value, JITFunction):
                    patches.append((module, attr, InterpretedFunction(value.fn)))
    for attr, value in vars(tl.core.tensor).items():  # x.sum(), x.to(): wrappers closing over a JITFunction
        cells = getattr(value, "__closure__", None) or ()
        jitted = [c.cell_contents for c in cells if isinstance(c.cell_contents, JITFunction)]
        if jitted:
            patches.append((tl.core.tensor, attr, _member(InterpretedFunction(jitted[0].fn))))
    return tuple(patches)


def _member(function: InterpretedFunction) -> Callable[..., Any]:
    def member(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)
    return member


def _language_namespaces() -> list[Any]:
    """triton.language's modules and classes: everything the interpreter patches while it runs."""
    modules = [m for name, m in list(sys.modules.items())
               if name == "triton.language" or name.startswith("triton.language.")]
    classes = {id(v): v for m in modules for v in vars(m).values()
               if isinstance(v, type) and v.__module__.startswith("triton.language")}
    return [*modules, *classes.values()]


@contextlib.contextmanager
def interpreted_language() -> Iterator[None]:
    """Triton's library functions interpreted while an interpreted kernel runs (see the top).

    Everything in triton.language is restored afterwards: the interpreter patches some of it for
    a device-function call without undoing it, which would break a later compile in this process.
    """
    # the mode is scoped to the launch: Triton's lazily imported parts check it too
    with _MODE_LOCK, _triton_mode(interpret=True), _replaced(_interpreter_shortcuts()), _one_torch_thread():
        _scalar_index_in_interpreter()
        namespaces = _language_namespaces()
        saved = [(owner, dict(vars(owner))) for owner in namespaces]
        for owner, attr, interpreted in _language_patches():
            setattr(owner, attr, interpreted)
        try:
            yield
        finally:
            for owner, before in saved:
                _restore(owner, before)


def _interpreter_shortcuts() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, value): three costs of Triton's interpreter that buy nothing here, replaced
    while an interpreted kernel runs.
    - It computes an int64 check of every int32 +, - and * (its sanitize_overflow option) and then
      drops it unless debug mode is on: a third of an interpreted GEMM's time (the simulated NPU's
      1024x3072x768 GEMM: 10 of 30 s profiled). Off, unless debug mode would assert it.
    - It patches triton.language for a kernel's launch, then again on every call of a device
      function inside it: 1.35 ms a call, 2.6 of 7.5 s of an interpreted flash attention.
      _device_function_call skips it where the launch's patch already holds.
    - Its erf is math.erf called once per element (np.vectorize): 0.47 s of a 5.6 s run of the NPU
      GEMM with GELU (3.1M elements). torch's float64 erf over the array (on one thread) takes
      0.02 s: the same float32 values (8M inputs compared), float64 within one ulp."""
    builder = triton_interpreter.interpreter_builder
    shortcuts = [(InterpretedFunction, "__call__", _device_function_call),
                 (triton_interpreter, "np_erf_fp32", functools.partial(_erf_in_float64, dtype=np.float32)),
                 (triton_interpreter, "np_erf_fp64", functools.partial(_erf_in_float64, dtype=np.float64))]
    if not builder.options.debug:
        shortcuts.append((builder, "options", dataclasses.replace(builder.options, sanitize_overflow=False)))
    return shortcuts


def _device_function_call(self: InterpretedFunction, *args: Any, **kwargs: Any) -> Any:
    """InterpretedFunction.__call__, patching triton.language only where the launch has not."""
    languages = [value for value in self.fn.__globals__.values() if value is tl or value is tl.core]
    if any(tl.core.is_builtin(language.load) for language in languages):  # not patched yet
        triton_interpreter._patch_lang(self.fn)
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise triton_interpreter.InterpreterError(repr(exc)) from exc


def _erf_in_float64(values: Any, dtype: Any) -> Any:
    return torch.special.erf(torch.from_numpy(np.asarray(values, np.float64))).numpy().astype(dtype)


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch ops inside an interpreted kernel (the erf above) on one thread: the interpreter's numpy
    work between two of them lets torch's pool sleep, and waking it cost 3.8 ms a call of a 64x256
    tile (0.74 of 4.6 s of the NPU GEMM with GELU) where one thread takes 0.1 ms, and as long as two
    over 3M elements; its spinning threads also slowed the numpy work after each call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _replaced(replacements: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each (owner, attribute) set to its value inside, its own value back afterwards."""
    before = [(owner, name, getattr(owner, name)) for owner, name, _ in replacements]
    for owner, name, value in replacements:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(before):
            setattr(owner, name, value)


@functools.cache
def _scalar_index_in_interpreter() -> None:
    """Triton 3.6's interpreter makes a scalar an index with int() on its one-element array, which
    numpy 2.4 refuses (`for i in range(tl.cdiv(n, BLOCK))` fails in every kernel with such a loop);
    Triton 3.7 squeezes the array first. 3.6 is given 3.7's conversion."""
    if tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 7):
        return
    from triton.runtime import interpreter
    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_with_scalar_index(tensor: Any, scope: Any) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_tensor_with_scalar_index


def _restore(owner: Any, before: dict[str, Any]) -> None:
    """Put back every changed attribute; names the interpreter added to a module stay (its cached
    rewritten functions look them up there), names it added to a class go."""
    if isinstance(owner, type):
        for attr in [a for a in vars(owner) if a not in before]:
            delattr(owner, attr)
    for attr, value in before.items():
        if vars(owner).get(attr, _MISSING) is not value:
            setattr(owner, attr, value)


_TORCH_DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool,
}


@contextlib.contextmanager
def float32_contractions() -> Iterator[None]:
    """float32 matmuls and convolutions computed in float32: torch lets cuDNN round fp32 inputs to
    TF32 (10 mantissa bits) by default, and cuBLAS too where a user allowed it. On an H200,
    inception_v1 with every task on its torch baseline was 7.6e-4 off onnxruntime (tolerance 1e-4).
    Both switches are off inside and restored after."""
    switches = (torch.backends.cudnn, torch.backends.cuda.matmul)
    previous = [switch.allow_tf32 for switch in switches]
    for switch in switches:
        switch.allow_tf32 = False
    try:
        yield
    finally:
        for switch, allowed in zip(switches, previous, strict=True):
            switch.allow_tf32 = allowed


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name} has no torch equivalent here") from None


def scratch_specs(module: types.ModuleType, task: Task, config: dict[str, Any]) -> list[TensorSpec]:
    """Workspace a module asks for through its optional `scratch(task, config)`; appended to outputs."""
    declare = getattr(module, "scratch", None)
    if declare is None:
        return []
    return [TensorSpec(tuple(int(d) for d in shape), dtype) for shape, dtype in declare(task, config)]


# --- recording the launches a module's `launch` makes -------------------------------------------

@dataclass
class Launch:
    """One kernel launch made by a module's launch(): enough to compile it ahead of time."""

    kernel: Any  # a JITFunction (or InterpretedFunction)
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    compiled: Any = None  # what Triton's JIT returned when the launch was forwarded (GPU)

    @property
    def name(self) -> str:
        return str(self.kernel.__name__)

    def bound(self) -> dict[str, Any]:
        """Kernel parameters by name, defaults filled in."""
        params = self.kernel.params
        values = {p.name: p.default for p in params if p.has_default}
        values.update(zip([p.name for p in params][:len(self.args)], self.args, strict=True))
        names = {p.name for p in params}
        values.update((k, v) for k, v in self.kwargs.items() if k in names)
        return values

    def options(self) -> dict[str, Any]:
        """Compiler options passed at launch (num_warps, num_stages, ...)."""
        names = {p.name for p in self.kernel.params}
        return {k: v for k, v in self.kwargs.items() if k not in names}


def _grid_tuple(grid: Any) -> tuple[int, ...]:
    values = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    return tuple(int(v) for v in values)


def _is_kernel(value: Any) -> bool:
    return isinstance(value, (JITFunction, InterpretedFunction))


def record_launches(module: types.ModuleType, run: Callable[[], None], mode: str) -> list[Launch]:
    """Call `run` (which calls module.launch) and record each launch of the module's @triton.jit kernels.

    `kernel[grid](...)` calls `kernel.run(..., grid=, warmup=)`; an instance attribute shadows that
    method for the duration, so the module's globals stay untouched (the GPU JIT hashes the globals
    a kernel body reads, helper @jit functions among them, and the compiler resolves them there).
    mode 'record': nothing is built or run, so meta tensors (shapes and strides, no memory) are
    enough; 'build': Triton's JIT compiles each launch for the device (into its on-disk cache) and
    launches nothing; 'run': the launches really happen.
    """
    if mode not in ("record", "build", "run"):
        raise ValueError(f"mode {mode!r} is not record, build or run")
    kernels = [value for value in vars(module).values() if _is_kernel(value)]
    launches: list[Launch] = []
    with _MODE_LOCK:
        for kernel in kernels:
            kernel.run = _recording_run(kernel, launches, mode)
        try:
            run()
        finally:
            for kernel in kernels:
                vars(kernel).pop("run", None)
    return launches


def _recording_run(kernel: Any, launches: list[Launch], mode: str) -> Callable[..., Any]:
    original = type(kernel).run.__get__(kernel)

    def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        launch = Launch(kernel, (), args, kwargs)
        launch.grid = _grid_tuple(grid(launch.bound()) if callable(grid) else grid)
        if mode != "record":  # Triton's warm-up compiles (and caches) without launching
            launch.compiled = original(*args, grid=grid, warmup=warmup or mode == "build", **kwargs)
        launches.append(launch)
        return launch.compiled
    return run
