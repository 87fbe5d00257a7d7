"""Kernel modules: variants written as source text that follows a backend's contract.

Built-in variants, rule-derived variants and LLM proposals are all this: a module that defines

    KIND = "gemm"                       # the task kind it implements
    PRECISION = "fp32"                  # the accuracy it promises (sets the gate's tolerance)
    SPACE = {"BLOCK_M": [64, 128], ...} # its parameters and their choices
    DEFAULT = {"BLOCK_M": 64, ...}      # a configuration that is valid for typical shapes
    def constraints(task, config, target): -> str | None   # why a config cannot work, or None
    def launch(task, config, inputs, outputs): ...         # run it (backend-specific buffers)
    def fixed(task, target): -> dict    # optional: parameters the task and target decide alone

The header is read without executing anything (literals only). A static check admits only the
contract's imports and rejects anything that could cheat the gate or escape the sandbox.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import types
from typing import Any, Callable, Iterable

from .base import Variant

_HEADER = ("KIND", "PRECISION", "SPACE", "DEFAULT")
_REQUIRED_FUNCTIONS = ("constraints", "launch")

# Names that would let a kernel call the op it replaces, hide work, touch files or the network,
# or patch timers. A kernel module has no business with any of them.
_FORBIDDEN_NAMES = frozenset({
    "torch", "os", "sys", "subprocess", "threading", "multiprocessing", "socket", "ctypes",
    "time", "open", "eval", "exec", "compile", "__import__", "globals", "locals", "vars",
    "importlib", "builtins", "__builtins__", "setattr", "delattr", "breakpoint", "input",
    "signal", "shutil", "pathlib", "requests", "urllib", "http", "asyncio", "concurrent",
    "cupy", "jax", "onnxruntime", "scipy", "pickle", "marshal", "gc", "inspect",
    "getattr", "hasattr", "__getattribute__",
})
# Outside @triton.jit bodies a launcher handles framework tensors; these methods would compute on
# them with the framework (x.amax().exp() ...) instead of in the kernel. Inside jit bodies the same
# names are the kernel language's own (tl.exp, tl.sum) and are allowed.
_TENSOR_COMPUTE_METHODS = frozenset({
    "abs", "add", "add_", "addmm", "amax", "amin", "argmax", "baddbmm", "clamp", "clone", "copy_",
    "cos", "cumsum", "div", "div_", "erf", "exp", "exp_", "expm1", "fill_", "log", "log_softmax",
    "max", "mean", "min", "mul", "mul_", "neg", "norm", "pow", "prod", "reciprocal", "relu", "rsqrt",
    "sigmoid", "sin", "sqrt", "square", "std", "sub", "sub_", "sum", "tanh", "to", "var", "where",
    "zero_", "cpu", "numpy", "tolist", "item", "float", "half", "double", "bfloat16",
    "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "empty_like", "zeros_like",
    "index_select", "gather", "scatter", "masked_fill", "masked_fill_", "sort", "topk",
})
_FORBIDDEN_ATTRS = frozenset({
    "Stream", "stream", "cuda", "synchronize", "__dict__", "__class__", "__globals__",
    "__subclasses__", "__code__", "perf_counter", "matmul", "mm", "bmm", "softmax",
    "layer_norm", "scaled_dot_product_attention", "conv2d", "linear", "einsum", "dot_general",
})


class KernelSourceError(ValueError):
    """The source breaks the kernel-module contract or the static check."""


_INCLUDE_LINE = re.compile(r"^# include: (\w+)[ \t]*$", re.M)


def expand_includes(text: str, read: Callable[[str], str]) -> str:
    """Replace each `# include: NAME` line by the (expanded) text of _NAME.py; a name already
    included leaves a marker comment, and a cycle is an error."""
    done: set[str] = set()

    def expand(text: str, stack: frozenset[str]) -> str:
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in stack:
                raise KernelSourceError(f"include cycle through '{name}'")
            if name in done:
                return f"# ({name} is included above)"
            done.add(name)
            return expand(read(name), stack | {name}).rstrip("\n")
        return _INCLUDE_LINE.sub(replace, text)

    return expand(text, frozenset())


def static_check(source: str, allowed_imports: Iterable[str]) -> None:
    """Reject source that imports outside the contract or names forbidden objects."""
    allowed = set(allowed_imports)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise KernelSourceError(f"syntax error: {exc.msg} (line {exc.lineno})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in allowed:
                    raise KernelSourceError(f"import of '{alias.name}' is not allowed "
                                            f"(allowed: {', '.join(sorted(allowed))})")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module not in allowed:
                raise KernelSourceError(f"import from '{module}' is not allowed")
        elif isinstance(node, ast.Name) and node.id in _FORBIDDEN_NAMES:
            raise KernelSourceError(f"use of '{node.id}' is not allowed in a kernel (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr in _FORBIDDEN_ATTRS:
            raise KernelSourceError(f"use of '.{node.attr}' is not allowed in a kernel (line {node.lineno})")
    jit_nodes = {id(inner) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and _is_jit(fn)
                 for inner in ast.walk(fn)}
    modules = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in jit_nodes and node.attr in _TENSOR_COMPUTE_METHODS \
                and _base_name(node) not in modules:
            raise KernelSourceError(f"'.{node.attr}' outside a kernel body computes with the framework, "
                                    f"not the kernel (line {node.lineno})")
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = [f for f in _REQUIRED_FUNCTIONS if f not in defined]
    if missing:
        raise KernelSourceError(f"missing function(s): {', '.join(missing)}")


def _base_name(node: ast.expr) -> str:
    """The leftmost name of an attribute chain: 'math' for math.sqrt, 'x' for x.amax().exp."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _is_jit(function: ast.FunctionDef) -> bool:
    """Decorated with triton.jit / jit (optionally called with arguments)."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "jit":
            return True
    return False


def read_header(source: str) -> dict[str, Any]:
    """KIND, PRECISION, SPACE, DEFAULT as literals, without running the module."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise KernelSourceError(f"syntax error: {exc.msg} (line {exc.lineno})") from None
    header: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in _HEADER:
                try:
                    header[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    raise KernelSourceError(f"{target.id} must be a literal") from None
    missing = [h for h in _HEADER if h not in header]
    if missing:
        raise KernelSourceError(f"missing header field(s): {', '.join(missing)}")
    for field_name in ("KIND", "PRECISION"):
        if not isinstance(header[field_name], str):
            raise KernelSourceError(f"{field_name} must be a string")
    if not isinstance(header["DEFAULT"], dict):
        raise KernelSourceError("DEFAULT must be a dict of parameter -> value")
    space = header["SPACE"]
    if not isinstance(space, dict) or not all(isinstance(v, (list, tuple)) and v for v in space.values()):
        raise KernelSourceError("SPACE must map each parameter to a non-empty list of choices")
    default = header["DEFAULT"]
    if set(default) != set(space):
        raise KernelSourceError("DEFAULT must give a value for exactly the parameters in SPACE")
    return header


def variant_from_source(name: str, source: str, backend: str, origin: str,
                        allowed_imports: Iterable[str]) -> Variant:
    static_check(source, allowed_imports)
    header = read_header(source)
    return Variant(
        name=name, kind=header["KIND"], backend=backend, source=source,
        space={k: tuple(v) for k, v in header["SPACE"].items()}, default=dict(header["DEFAULT"]),
        precision=header["PRECISION"], origin=origin,
    )


def load_module(variant: Variant, allowed_imports: Iterable[str]) -> types.ModuleType:
    """Execute a variant's source as a module (in the worker process that will run it).

    Triton's JIT reads kernel source through `inspect`, so the text is registered with linecache
    under a unique file name before it runs.
    """
    import linecache

    static_check(variant.source, allowed_imports)
    filename = f"<portkern:{variant.backend}:{variant.name}:{variant.source_hash}>"
    linecache.cache[filename] = (len(variant.source), None, variant.source.splitlines(True), filename)
    module = types.ModuleType(f"portkern_kernel_{variant.name}_{variant.source_hash}")
    module.__file__ = filename
    exec(compile(variant.source, filename, "exec"), module.__dict__)  # noqa: S102 - checked above
    return module


def narrowed(variant: Variant, load: Callable[[Variant], types.ModuleType], task: Any, target: Any) -> Variant:
    """The variant as the search draws it for this task: each parameter its module's optional
    fixed(task, target) decides is pinned to that value (it may lie outside SPACE's choices, e.g. a
    persistent kernel's program count, which is the target's SM count). A choice no configuration
    could use on this task and target (a switch for grouped heads on a task without them, TMA on a
    target without it) would otherwise be drawn, refused and flipped back after every new best.
    A module that fails to load or to decide (a proposal's) is searched as it is: its constraints
    still refuse what cannot run, and the backend's check says why it does not load."""
    try:
        decide = getattr(load(variant), "fixed", None)
        pinned = decide(task, target) if decide is not None else {}
    except Exception:  # noqa: BLE001 - untrusted source: its failure shows where it is checked
        return variant
    if not isinstance(pinned, dict) or not set(pinned) <= set(variant.space):
        return variant
    if all(variant.space[name] == (value,) for name, value in pinned.items()):
        return variant
    space = {name: (pinned[name],) if name in pinned else choices for name, choices in variant.space.items()}
    return dataclasses.replace(variant, space=space, default={**variant.default, **pinned})
