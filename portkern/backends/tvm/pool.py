"""Max / average pooling over KH x KW windows (NCHW) on the CPU, vectorized along output columns.

The input is copied into a frame padded with -inf (max) or 0 (avg) and wide enough for whole
tiles of tile_w output columns, so the window loop has no bounds tests; the average divides by the
window's count of real (unpadded) positions unless count_include_pad. Global average pooling is
global_pool.py.
"""
from __future__ import annotations

from typing import Any, Mapping

import tvm
from tvm import s_tir, te

from ...hwprofile import Target
from ...tasks import Task
from .common import (
    HostFacts,
    Kernel,
    ceil_to,
    check_float32,
    check_space,
    check_vector,
    inline_elementwise,
    needs_padding,
    padded_input,
    schedule_epilogue,
)

KIND = "pool"
PRECISION = "fp32"
SPACE = {
    "tile_w": [8, 16, 32, 64],
    "vector_lanes": [4, 8, 16],
    "parallel": [True, False],
}
DEFAULT = {"tile_w": 16, "vector_lanes": 16, "parallel": True}


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    if task.attr("op") not in ("max", "avg"):
        return f"pool op {task.attr('op')} is not a windowed max/avg (global_avg: tvm_global_pool)"
    reason = check_vector(config["vector_lanes"], config["tile_w"], HostFacts.of(target), "tile_w")
    if reason:
        return reason
    out_w = task.outputs[0].shape[3]
    if config["tile_w"] > 2 * ceil_to(out_w, config["vector_lanes"]):
        return f"tile_w={config['tile_w']} is over twice the output row ({out_w}): mostly padding"
    return None


def _window_count(index: Any, stride: int, pad: int, kernel: int, size: int) -> Any:
    """How many of a window's positions along one axis fall inside the unpadded input."""
    start = index * stride - pad
    return te.min(start + kernel, size) - te.max(start, 0)


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    tile_w, lanes = config["tile_w"], config["vector_lanes"]
    x_shape, out_shape = tuple(task.inputs[0].shape), tuple(task.outputs[0].shape)
    _, _, height, width = x_shape
    out_h, out_w = out_shape[2:]
    kh, kw = task.attr("kernel")
    sh, sw = task.attr("strides")
    pad_top, pad_left = task.attr("pads")[:2]
    is_max = task.attr("op") == "max"
    padded_w = ceil_to(out_w, tile_w)
    in_h, in_w = (out_h - 1) * sh + kh, (padded_w - 1) * sw + kw

    x = te.placeholder(x_shape, "float32", name="x")
    fill = float("-inf") if is_max else 0.0
    source = padded_input(x, pad_top, pad_left, in_h, in_w, fill) \
        if needs_padding(x_shape, pad_top, pad_left, in_h, in_w) else x
    ri = te.reduce_axis((0, kh), name="ri")
    rj = te.reduce_axis((0, kw), name="rj")
    reducer = te.max if is_max else te.sum
    acc = te.compute(out_shape[:3] + (padded_w,),
                     lambda n, c, i, j: reducer(source[n, c, i * sh + ri, j * sw + rj], axis=[ri, rj]),
                     name="acc")
    if is_max:
        out = te.compute(out_shape, lambda n, c, i, j: acc[n, c, i, j], name="out")
    elif task.attr("count_include_pad", False):
        out = te.compute(out_shape, lambda n, c, i, j: acc[n, c, i, j] * (1.0 / (kh * kw)), name="out")
    else:
        out = te.compute(out_shape, lambda n, c, i, j: acc[n, c, i, j] / tvm.tirx.Cast(
            "float32", _window_count(i, sh, pad_top, kh, height) * _window_count(j, sw, pad_left, kw, width)),
            name="out")

    sch = s_tir.Schedule(te.create_prim_func([x, out]))
    inline_elementwise(sch, keep=("acc", "out", "x_padded"))
    block = sch.get_sblock("acc")
    n, c, i, j, wi, wj = sch.get_loops(block)
    j_tile, j_reg = sch.split(j, [None, tile_w])
    j_unrolled, j_vector = sch.split(j_reg, [None, lanes])
    sch.reorder(n, c, i, j_tile, wi, wj, j_unrolled, j_vector)
    sch.vectorize(j_vector)
    sch.unroll(j_unrolled)
    fused = sch.fuse(n, c, i)
    if config["parallel"]:
        sch.parallel(fused)
    schedule_epilogue(sch, j_tile, lanes)
    sch.decompose_reduction(block, wi)
    if config["parallel"] and source is not x:
        sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock("x_padded"))[:2]))
    return Kernel(sch.mod, (x_shape, out_shape))
