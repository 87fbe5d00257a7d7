"""Direct NCHW convolution on the CPU: register tiles of output channels x output columns.

out = act(conv(x, w) + bias + residual) (the ResNet order). A register tile holds tile_oc output
channels of tile_w consecutive outputs of one output row: each step of the reduction broadcasts
one weight per channel and loads one vector of input per row, so the tile stays in vector
registers for the whole C*KH*KW reduction, then the epilogue runs on it before it is stored.
Output columns are padded to whole tiles (the input is copied to a zero-padded buffer when padding
or that extension needs it), output channels by clamping weight rows.

Knobs beyond the tile: spatial="flat" re-cuts a 1x1, stride-1, unpadded convolution's H*W plane
into rows of whole tiles where it can (56x56 is 14 rows of 224): no padded tiles and no padded
copy of the input on most CNN shapes. c_block splits the channel reduction: all output columns of
a row accumulate one block of channels before the next (partial sums stay in a small row buffer),
so the input rows a block reads stay in L1 instead of being refetched across a 12 KB channel
stride per tile. outer="row_oc" walks all channel tiles of one output row before the next row, so
the input rows they share come from cache rather than being streamed once per channel tile.
pack_w copies the weights to [OC/tile_oc, C/g, KH, KW, tile_oc] so a tile's weights are adjacent.
computation() is the convolution's one TE definition; cuda/conv2d.py schedules it for GPUs.
"""
from __future__ import annotations

from typing import Any, Mapping

from tvm import s_tir, te

from ...hwprofile import Target
from ...tasks import Task
from .common import (
    Computation,
    HostFacts,
    Kernel,
    ceil_to,
    check_float32,
    check_registers,
    check_space,
    check_vector,
    clamp,
    epilogue,
    inline_elementwise,
    needs_padding,
    padded_input,
    schedule_epilogue,
)

KIND = "conv2d"
PRECISION = "fp32"
SPACE = {
    "tile_oc": [1, 2, 4, 6, 8, 12],
    "tile_w": [8, 16, 32, 48, 64],
    "vector_lanes": [4, 8, 16],
    "spatial": ["rows", "flat"],
    "reduce_order": ["c_outer", "c_inner"],
    "c_block": [8, 16, 32, 64, 1024],
    "outer": ["oc_row", "row_oc"],
    "pack_w": [True, False],
    "parallel": [True, False],
}
DEFAULT = {"tile_oc": 6, "tile_w": 32, "vector_lanes": 16, "spatial": "flat",
           "reduce_order": "c_outer", "c_block": 32, "outer": "row_oc", "pack_w": True, "parallel": True}
FLAT_ROW_MAX = 256


def _is_pointwise(task: Task) -> bool:
    """1x1, stride 1, no padding: the output plane is the input plane."""
    kernel = task.inputs[1].shape[2:]
    return (tuple(kernel) == (1, 1) and tuple(task.attr("strides", (1, 1))) == (1, 1)
            and not any(task.attr("pads", (0, 0, 0, 0))))


def _flat_row(plane: int, tile_w: int) -> int:
    """Row length for a flattened plane: the longest divisor of it made of whole tiles, up to
    FLAT_ROW_MAX (no padded tiles, and rows short enough to share input rows across channel
    tiles in cache); the whole plane, padded, when no such divisor exists."""
    whole = [length for length in range(tile_w, FLAT_ROW_MAX + 1, tile_w) if plane % length == 0]
    return max(whole) if whole else plane


Geometry = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def task_geometry(task: Task) -> Geometry:
    """Shapes of x, w and out as the task gives them."""
    return tuple(task.inputs[0].shape), tuple(task.inputs[1].shape), tuple(task.outputs[0].shape)


def _geometry(task: Task, config: Mapping[str, Any]) -> Geometry:
    """Shapes of x, w and out as the kernel sees them (flat: the plane re-cut into other rows)."""
    x_shape, w_shape, out_shape = task.inputs[0].shape, task.inputs[1].shape, task.outputs[0].shape
    if config["spatial"] == "flat":
        n, c, h, w = x_shape
        row = _flat_row(h * w, config["tile_w"])
        return (n, c, h * w // row, row), tuple(w_shape), (n, out_shape[1], h * w // row, row)
    return task_geometry(task)


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    facts = HostFacts.of(target)
    tile_oc, tile_w, lanes = config["tile_oc"], config["tile_w"], config["vector_lanes"]
    reason = check_vector(lanes, tile_w, facts, "tile_w") or check_registers(tile_oc, tile_w, lanes, facts)
    if reason:
        return reason
    if config["spatial"] == "flat" and not _is_pointwise(task):
        return "spatial=flat needs a 1x1 convolution with stride 1 and no padding"
    if task.attr("residual") and task.inputs[-1].shape != task.outputs[0].shape:
        return f"residual {task.inputs[-1]} broadcasts; this template adds a full {task.outputs[0]}"
    group_c = task.inputs[1].shape[1]
    if config["c_block"] < group_c and group_c % config["c_block"]:
        return f"c_block={config['c_block']} does not divide the {group_c} channels per group"
    row = _geometry(task, config)[2][3]
    if tile_w > 2 * ceil_to(row, lanes):
        return f"tile_w={tile_w} is over twice the output row ({row}): the tile would be mostly padding"
    return None


def computation(task: Task, geometry: Geometry, tile_oc: int, tile_w: int, pack_w: bool) -> Computation:
    """out = act(conv(x, w) + bias + residual), accumulated ("acc") over output channels padded to
    whole tile_oc tiles (clamped weight rows) and output columns padded to whole tile_w tiles; the
    input is read through a zero-padded frame ("x_padded") where padding or that extension needs
    it. pack_w copies the weights to [OC/tile_oc, C/g, KH, KW, tile_oc] ("w_packed")."""
    x_shape, w_shape, out_shape = geometry
    batch = x_shape[0]
    out_c, group_c, kh, kw = w_shape
    _, _, out_h, out_w = out_shape
    group = int(task.attr("group", 1))
    sh, sw = task.attr("strides", (1, 1))
    dh, dw = task.attr("dilations", (1, 1))
    pad_top, pad_left = task.attr("pads", (0, 0, 0, 0))[:2]
    padded_oc, padded_w = ceil_to(out_c, tile_oc), ceil_to(out_w, tile_w)

    x = te.placeholder(x_shape, "float32", name="x")
    weight = te.placeholder(w_shape, "float32", name="w")
    inputs = [x, weight]
    bias = te.placeholder((out_c,), "float32", name="bias") if task.attr("bias") else None
    residual = te.placeholder(out_shape, "float32", name="residual") if task.attr("residual") else None
    inputs += [t for t in (bias, residual) if t is not None]

    in_h = (out_h - 1) * sh + (kh - 1) * dh + 1
    in_w = (padded_w - 1) * sw + (kw - 1) * dw + 1
    source = padded_input(x, pad_top, pad_left, in_h, in_w, 0.0) \
        if needs_padding(x_shape, pad_top, pad_left, in_h, in_w) else x

    if pack_w:
        packed = te.compute((padded_oc // tile_oc, group_c, kh, kw, tile_oc),
                            lambda o, c, i, j, r: weight[clamp(o * tile_oc + r, out_c), c, i, j],
                            name="w_packed")

        def w_read(oc: Any, c: Any, i: Any, j: Any) -> Any:
            return packed[oc // tile_oc, c, i, j, oc % tile_oc]
    else:
        def w_read(oc: Any, c: Any, i: Any, j: Any) -> Any:
            return weight[clamp(oc, out_c), c, i, j]

    def in_channel(oc: Any, c: Any) -> Any:
        return c if group == 1 else clamp(oc, out_c) // (out_c // group) * group_c + c

    rc = te.reduce_axis((0, group_c), name="rc")
    ri = te.reduce_axis((0, kh), name="ri")
    rj = te.reduce_axis((0, kw), name="rj")
    acc = te.compute(
        (batch, padded_oc, out_h, padded_w),
        lambda n, oc, i, j: te.sum(
            source[n, in_channel(oc, rc), i * sh + ri * dh, j * sw + rj * dw] * w_read(oc, rc, ri, rj),
            axis=[rc, ri, rj]),
        name="acc")
    out = epilogue(acc, out_shape, task.attr("activation", "none"),
                   (lambda n, oc, i, j: bias[oc]) if bias is not None else None, residual,
                   residual_first=True)
    shapes = [x_shape, w_shape] + [(out_c,)] * (bias is not None) + [out_shape] * (residual is not None)
    return Computation((*inputs, out), (*shapes, out_shape))


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    tile_oc, tile_w, lanes = config["tile_oc"], config["tile_w"], config["vector_lanes"]
    computed = computation(task, _geometry(task, config), tile_oc, tile_w, config["pack_w"])
    group_c = task.inputs[1].shape[1]

    sch = s_tir.Schedule(computed.prim_func())
    inline_elementwise(sch, keep=("acc", "out", "x_padded", "w_packed"))
    block = sch.get_sblock("acc")
    n, oc, i, j, c, ki, kj = sch.get_loops(block)
    oc_tile, oc_reg = sch.split(oc, [None, tile_oc])
    j_tile, j_reg = sch.split(j, [None, tile_w])
    j_unrolled, j_vector = sch.split(j_reg, [None, lanes])
    blocked = config["c_block"] < group_c
    c_outer, c = sch.split(c, [None, config["c_block"]]) if blocked else (None, c)
    reduction = (c, ki, kj) if config["reduce_order"] == "c_outer" else (ki, kj, c)
    row_loops = (c_outer, j_tile) if blocked else (j_tile,)
    outer = (n, oc_tile, i) if config["outer"] == "oc_row" else (n, i, oc_tile)
    sch.reorder(*outer, *row_loops, *reduction, oc_reg, j_unrolled, j_vector)
    sch.vectorize(j_vector)
    sch.unroll(j_unrolled)
    sch.unroll(oc_reg)
    fused = sch.fuse(*outer)
    if config["parallel"]:
        sch.parallel(fused)
    schedule_epilogue(sch, fused if blocked else j_tile, lanes)
    sch.decompose_reduction(block, c_outer if blocked else reduction[0])

    for name in ("x_padded", "w_packed"):
        if any(sch.get(b).name_hint == name for b in sch.get_child_blocks(sch.get_sblock("root"))):
            loops = sch.get_loops(sch.get_sblock(name))
            if config["parallel"]:
                sch.parallel(sch.fuse(*loops[:2]))

    return Kernel(sch.mod, computed.arg_shapes)
