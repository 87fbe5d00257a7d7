"""Elementwise chains as one TE computation: partition.py's expression language (steps "t0".."tN"
over inputs "in0".."inK", broadcast to the output's shape, and inline float constants), and its
CPU schedule; cuda/elementwise.py schedules the same computation for GPUs.

Steps compute in float32; the activations are common.ACTIVATIONS (the GEMM epilogue's own forms),
pow by a constant 2, 3 or 0.5 is a product or a square root (exact for negative bases, which a
fast-math powf is not).

On the CPU the whole chain is one pass over the flat output: vectors of vector_lanes floats,
`chunk` floats to a parallel task; each step computes one vector at a time under the output's
vector loop, so a step's value lives in a register between the steps (an unfused chain, as
onnxruntime runs a GELU written out in ops, reads and writes the tensor once per op).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tvm
from tvm import s_tir, te

from ...hwprofile import Target
from ...tasks import EXPRESSION_ACTIVATIONS, Task
from .common import ACTIVATIONS, Computation, HostFacts, Kernel, check_lanes, check_space, inline_elementwise, own_loops

Operand = Any  # a step's tensor or a float constant

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "max": te.max, "min": te.min, "pow": te.power,
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "sqrt": te.sqrt, "exp": te.exp, "log": te.log, "erf": te.erf, "abs": te.abs,
    "neg": lambda a: -a, "reciprocal": lambda a: 1.0 / a,
}
_POWERS: dict[float, Callable[[Any], Any]] = {2.0: lambda a: a * a, 3.0: lambda a: a * a * a, 0.5: te.sqrt}
STEPS = frozenset({*_BINARY, *_UNARY, *EXPRESSION_ACTIVATIONS, "where"})


def check_expression(task: Task) -> str | None:
    """Why this template cannot compute the task's expression, or None."""
    if task.outputs[0].dtype != "float32":
        return f"the elementwise template computes float32 only (output is {task.outputs[0].dtype})"
    conditions = {step[1] for step in task.attr("expr") if step[0] == "where" and isinstance(step[1], str)}
    for index, spec in enumerate(task.inputs):
        expected = "bool" if f"in{index}" in conditions else "float32"
        if spec.dtype != expected:
            return f"input in{index} is {spec.dtype}; the elementwise template takes {expected} there"
    for op, *_ in task.attr("expr"):
        if op not in STEPS:
            return f"expression step {op!r} has no TVM form here"
    return None


KIND = "elementwise"
PRECISION = "fp32"
SPACE = {"chunk": [256, 1024, 4096, 16384], "vector_lanes": [1, 4, 8, 16], "parallel": [True, False]}
DEFAULT = {"chunk": 1024, "vector_lanes": 16, "parallel": True}


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_expression(task) or check_space(config, SPACE) or check_lanes(config["vector_lanes"],
                                                                                 HostFacts.of(target))
    if reason:
        return reason
    size = math.prod(task.outputs[0].shape)
    if size % config["vector_lanes"]:
        return f"the output's {size} elements are not whole vectors of vector_lanes={config['vector_lanes']}"
    if config["chunk"] > size and config["chunk"] != SPACE["chunk"][0]:
        return f"chunk={config['chunk']} exceeds the output's {size} elements: the smallest chunk holds it already"
    return None


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    computed = computation(task)
    sch = s_tir.Schedule(computed.prim_func())
    inline_elementwise(sch, keep=("out", *computed.stages))
    lanes = config["vector_lanes"]
    vectors, lane = sch.split(sch.get_loops(sch.get_sblock("out"))[0], [None, lanes])
    tasks, vector = sch.split(vectors, [None, config["chunk"] // lanes])
    if config["parallel"]:
        sch.parallel(tasks)
    sch.vectorize(lane)
    for name in reversed(computed.stages):
        step = sch.get_sblock(name)
        sch.compute_at(step, vector, preserve_unit_loops=True)
        sch.vectorize(sch.fuse(*own_loops(sch, step)))
    return Kernel(sch.mod, computed.arg_shapes)


def computation(task: Task) -> Computation:
    """The expression over the flat output (one index, however many axes the output has): one
    stage per step ("t0".."tN", the `stages`; what a step computes internally, such as an
    activation's polynomial, is inlined into it) and "out". A schedule keeps the steps apart:
    inlined into each other, an activation that reads its operand many times would copy the
    whole chain before it that many times. An input of the output's shape is read flat too; a
    broadcast one at the coordinates it has."""
    out_shape = tuple(int(size) for size in task.outputs[0].shape)
    flat = (math.prod(out_shape),)
    placeholders: list[te.Tensor] = []
    values: dict[str, te.Tensor] = {}
    for index, spec in enumerate(task.inputs):
        shape = flat if tuple(spec.shape) == out_shape else tuple(spec.shape)
        placeholder = te.placeholder(shape, spec.dtype, name=f"in{index}")
        placeholders.append(placeholder)
        values[f"in{index}"] = placeholder if shape == flat else _broadcast(placeholder, out_shape)

    def tensor(ref: Operand) -> te.Tensor:
        if isinstance(ref, str):
            return values[ref]
        # the float32 the constant is: its shortest decimal form (the expression's) can lie just
        # past float32's range as a double (float32's lowest, a mask's fill, reads -3.4028235e38)
        return te.compute(flat, lambda f: tvm.tirx.const(float(np.float32(ref)), "float32"), name="constant")

    steps = [f"t{index}" for index in range(len(task.attr("expr")))]
    for name, (op, *args) in zip(steps, task.attr("expr")):
        values[name] = _renamed(_step(op, args, tensor, flat, f"{name}_{op}"), name)
    out = _renamed(values[steps[-1]], "out")
    shapes = tuple(tuple(int(size) for size in p.shape) for p in placeholders)
    return Computation((*placeholders, out), (*shapes, flat), tuple(steps))


def _renamed(x: te.Tensor, name: str) -> te.Tensor:
    return te.compute(x.shape, lambda *i: x(*i), name=name)


def _broadcast(x: te.Tensor, out_shape: Sequence[int]) -> te.Tensor:
    """x at every flat index of `out_shape`, numpy broadcasting rules (size-1 and missing axes
    repeat)."""
    offset = len(out_shape) - len(x.shape)
    strides = [math.prod(out_shape[axis + 1:]) for axis in range(len(out_shape))]

    def at(f: Any) -> Any:
        return x[tuple(0 if int(size) == 1 else f // strides[offset + axis] % out_shape[offset + axis]
                       for axis, size in enumerate(x.shape))]

    return te.compute((math.prod(out_shape),), at, name=f"{x.op.name}_broadcast")


def _step(op: str, args: Sequence[Any], tensor: Callable[[Operand], te.Tensor], shape: tuple[int, ...],
          name: str) -> te.Tensor:
    if op in ACTIVATIONS:
        return ACTIVATIONS[op](tensor(args[0]))
    if op == "where":
        condition, a, b = (tensor(arg) for arg in args)
        return te.compute(shape, lambda *i: te.if_then_else(condition(*i), a(*i), b(*i)), name=name)
    if op == "pow" and not isinstance(args[1], str) and float(args[1]) in _POWERS:
        base = tensor(args[0])
        return te.compute(shape, lambda *i: _POWERS[float(args[1])](base(*i)), name=name)
    if op in _BINARY:
        a, b = tensor(args[0]), tensor(args[1])
        return te.compute(shape, lambda *i: _BINARY[op](a(*i), b(*i)), name=name)
    operand = tensor(args[0])
    return te.compute(shape, lambda *i: _UNARY[op](operand(*i)), name=name)
