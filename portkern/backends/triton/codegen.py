"""Elementwise chains -> Triton kernel modules: one fused kernel generated per task from its `expr`.

The expression language is partition.py's (steps "t0".."tN" over inputs "in0".."inK" and inline
floats). The generated module follows the kernel-module contract like the hand-written variants;
what it bakes in is the task's broadcast geometry, collapsed so that dims every input treats alike
merge into one: a same-shape chain indexes with the flat output index alone, a bias add with one
`% N`, and every size and stride is a compile-time constant the compiler can vectorise against.
Inputs are read once, math runs in fp32 (a `cast` step rounds through its dtype), the output is
written once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ...tasks import Task
from ..base import Variant
from .modules import builtin_variant

VARIANT_NAME = "elementwise_fused"

# float64 steps compute in fp32 like every other step: the kernel promises fp32 accuracy
_TRITON_DTYPES = {"float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32",
                  "float64": "tl.float32", "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32",
                  "int64": "tl.int64", "uint8": "tl.uint8"}
_LOW_FLOATS = ("float16", "bfloat16")
_INT32_LIMIT = 2**31 - 2**16  # flat indices (plus one block of overshoot) must fit in int32


class ExprError(ValueError):
    """The expression uses a step or operand this generator does not know."""


@dataclass(frozen=True)
class Geometry:
    """The output shape with broadcast-alike dims merged, and each input's element strides in it."""

    sizes: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]  # per input, per collapsed dim; 0 where it broadcasts

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


def collapse(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]) -> Geometry:
    """Merge neighbouring output dims on which every (contiguous) input is either present or broadcast."""
    rank = len(out_shape)
    padded = [(1,) * (rank - len(shape)) + tuple(shape) for shape in in_shapes]
    dims: list[tuple[int, tuple[bool, ...]]] = []  # (size, which inputs are present on it)
    for axis, size in enumerate(out_shape):
        if size == 1:
            continue
        present = tuple(shape[axis] == size for shape in padded)
        if dims and dims[-1][1] == present:
            dims[-1] = (dims[-1][0] * size, present)
        else:
            dims.append((size, present))
    sizes = tuple(size for size, _ in dims)
    strides = []
    for index in range(len(in_shapes)):
        stride, per_dim = 1, []
        for size, present in reversed(dims):
            per_dim.append(stride if present[index] else 0)
            stride *= size if present[index] else 1
        strides.append(tuple(reversed(per_dim)))
    return Geometry(sizes, tuple(strides))


def _literal(value: Any) -> str:
    value = float(value)
    return repr(value) if math.isfinite(value) else f'float("{value}")'


_BINARY = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
           "max": "tl.maximum({0}, {1})", "min": "tl.minimum({0}, {1})"}
_UNARY = {
    "sqrt": "tl.sqrt({0})", "exp": "tl.exp({0})", "log": "tl.log({0})", "neg": "-({0})",
    "abs": "tl.abs({0})", "reciprocal": "1.0 / ({0})", "relu": "tl.maximum({0}, 0.0)", "erf": "tl.erf({0})",
    # the fused epilogues' activations (kernels/_activation.py, included by the template)
    "sigmoid": "_sigmoid({0})", "tanh": "_tanh({0})", "gelu": "_gelu({0})", "gelu_tanh": "_gelu_tanh({0})",
}


class _Steps:
    """Turns expression steps into lines of Triton; values live in fp32 unless a cast says otherwise."""

    def __init__(self, n_inputs: int) -> None:
        self.known = {f"in{i}" for i in range(n_inputs)}
        self.lines: list[str] = []

    def add(self, op: str, args: Sequence[Any]) -> None:
        name = f"t{len(self.lines)}"
        self.lines.append(f"{name} = {self._formula(op, args)}")
        self.known.add(name)

    def operand(self, ref: Any) -> str:
        if isinstance(ref, str):
            if ref not in self.known:
                raise ExprError(f"operand {ref!r} is neither a task input nor an earlier step")
            return ref
        if isinstance(ref, bool) or not isinstance(ref, (int, float)):
            raise ExprError(f"operand {ref!r} is neither a value name nor a number")
        return _literal(ref)

    def _formula(self, op: str, args: Sequence[Any]) -> str:
        if op == "cast" and len(args) == 2:
            return _cast(self.operand(args[0]), args[1])
        if op == "pow" and len(args) == 2:
            return self._power(self.operand(args[0]), args[1])
        values = [self.operand(arg) for arg in args]
        if op in _BINARY and len(values) == 2:
            return _BINARY[op].format(*values)
        if op in _UNARY and len(values) == 1:
            return _UNARY[op].format(*values)
        if op == "where" and len(values) == 3:
            return f"tl.where({values[0]} != 0, {values[1]}, {values[2]})"
        raise ExprError(f"unknown expression step {op!r} with {len(args)} operand(s)")

    def _power(self, base: str, exponent: Any) -> str:
        """x ** c by multiplication for small integer c, otherwise through exp2/log2 (sign kept for odd c)."""
        if isinstance(exponent, str):
            return f"tl.exp2({self.operand(exponent)} * tl.log2({base}))"
        c = float(exponent)
        if c == 0.5:
            return f"tl.sqrt({base})"
        if c.is_integer() and 0 < abs(c) <= 4:
            product = " * ".join([f"({base})"] * int(abs(c)))
            return product if c > 0 else f"1.0 / ({product})"
        if not c.is_integer():
            return f"tl.exp2({_literal(c)} * tl.log2({base}))"
        magnitude = f"tl.exp2({_literal(c)} * tl.log2(tl.abs({base})))"
        return magnitude if c % 2 == 0 else f"tl.where({base} < 0, -{magnitude}, {magnitude})"


def _cast(value: str, dtype: Any) -> str:
    if dtype == "bool":
        return f"({value} != 0)"
    if dtype not in _TRITON_DTYPES:
        raise ExprError(f"cast to {dtype!r} is not supported")
    if dtype in _LOW_FLOATS:  # round through the narrow type, keep computing in fp32
        return f"{value}.to({_TRITON_DTYPES[dtype]}).to(tl.float32)"
    return f"{value}.to({_TRITON_DTYPES[dtype]})"


def _offsets(geometry: Geometry, input_index: int) -> str:
    """The element offset of input `input_index` for output index `index`, constants folded in."""
    strides = geometry.strides[input_index]
    rank = len(geometry.sizes)
    if rank == 0 or all(s == 0 for s in strides):
        return ""
    contiguous = all(s == math.prod(geometry.sizes[d + 1:]) for d, s in enumerate(strides))
    if contiguous:
        return "index"
    terms = [_coordinate(geometry.sizes, d) + ("" if stride == 1 else f" * {stride}")
             for d, stride in enumerate(strides) if stride]
    return " + ".join(terms)


def _coordinate(sizes: Sequence[int], dim: int) -> str:
    """The position along collapsed dim `dim` of the flat output index."""
    inner = math.prod(sizes[dim + 1:])
    coordinate = "index" if inner == 1 else f"(index // {inner})"
    return coordinate if dim == 0 else f"({coordinate} % {sizes[dim]})"


def elementwise_source(task: Task) -> str:
    """The kernel module for one elementwise task (KIND, SPACE, constraints, launch and the kernel)."""
    expr = task.attr("expr")
    if not expr:
        raise ExprError("the task has no expression")
    geometry = collapse(task.outputs[0].shape, [spec.shape for spec in task.inputs])
    steps = _Steps(len(task.inputs))
    pointers = ", ".join(f"in{i}_ptr" for i in range(len(task.inputs)))
    body = []
    for i, spec in enumerate(task.inputs):
        offsets = _offsets(geometry, i)
        load = f"tl.load(in{i}_ptr + {offsets}, mask=in_range)" if offsets else f"tl.load(in{i}_ptr)"
        body.append(f"in{i} = {load}" + (".to(tl.float32)" if spec.dtype.startswith(("float", "bfloat")) else ""))
    for op, *args in expr:
        steps.add(op, args)
    body += steps.lines
    result = f"t{len(expr) - 1}"
    index_type = "tl.int64" if geometry.numel > _INT32_LIMIT else "tl.int32"
    kernel_body = "\n".join(f"    {line}" for line in body)
    return _TEMPLATE.format(
        expr=repr(tuple(tuple(step) for step in expr)), out_shape=repr(tuple(task.outputs[0].shape)),
        in_shapes=repr(tuple(tuple(spec.shape) for spec in task.inputs)), numel=geometry.numel,
        pointers=pointers, index_type=index_type, body=kernel_body, result=result,
    )


def elementwise_variants(task: Task) -> list[Variant]:
    """The generated variant(s) for an elementwise task; the backend's `variants(task)` calls this."""
    if task.kind != "elementwise":
        return []
    return [builtin_variant(VARIANT_NAME, elementwise_source(task))]


_TEMPLATE = '''"""Fused elementwise chain, generated by portkern's Triton codegen for one task.

expr: {expr}
output shape {out_shape}, input shapes {in_shapes}; the geometry below is baked in.
"""
import triton
import triton.language as tl

KIND = "elementwise"
PRECISION = "fp32"
SPACE = {{"BLOCK": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16]}}
DEFAULT = {{"BLOCK": 1024, "num_warps": 4}}

OUT_SHAPE = {out_shape}
IN_SHAPES = {in_shapes}
MAX_ELEMENTS_PER_THREAD = 64  # fp32 values a thread holds before registers spill


def constraints(task, config, target):
    if tuple(task.outputs[0].shape) != OUT_SHAPE or tuple(tuple(s.shape) for s in task.inputs) != IN_SHAPES:
        return "this kernel was generated for other shapes"
    threads = config["num_warps"] * target.profile.warp_size
    if config["BLOCK"] > MAX_ELEMENTS_PER_THREAD * threads:
        return f"{{config['BLOCK']}} elements over {{threads}} threads would spill"
    if config["BLOCK"] < threads:
        return f"a {{config['BLOCK']}}-element block leaves some of {{threads}} threads without work"
    return None


# include: activation


@triton.jit
def _fused(out_ptr, {pointers}, BLOCK: tl.constexpr):
    index = tl.program_id(0).to({index_type}) * BLOCK + tl.arange(0, BLOCK)
    in_range = index < {numel}
{body}
    tl.store(out_ptr + index, {result}.to(out_ptr.dtype.element_ty), mask=in_range)


def launch(task, config, inputs, outputs):
    _fused[(triton.cdiv({numel}, config["BLOCK"]),)](outputs[0], *inputs, BLOCK=config["BLOCK"],
                                                    num_warps=config["num_warps"])
'''
