"""Fused attention on the CPU: softmax(q k^T * scale + mask) v, one block of query rows at a time.

Every (batch, head, query) triple is a row. A thread takes `tile_rows` rows and keeps their score
rows (S_k floats each) in cache: scores as register tiles of tile_rows x tile_n (vectors along
keys), the softmax on those rows (lane-wise max and sum), then P @ v as register tiles of
tile_rows x D (vectors along the head dimension), divided by the row sums as they are stored.
The scores never travel to memory beyond the thread's own row buffer. k is read as (D, S_k); a
k given as (S_k, D) is transposed once into that layout at the start of the call. Causal masking
adds the lowest float above the diagonal, as the exported constant mask does. Keys are padded to
whole tile_n tiles (ViT's 197 tokens: 208 at tile_n 16), the padded ones masked the same way.
"""
from __future__ import annotations

from typing import Any, Mapping

import tvm
from tvm import s_tir, te, topi

from ...hwprofile import Target
from ...tasks import Task
from .common import (
    HostFacts,
    Kernel,
    check_float32,
    check_lanes,
    check_registers,
    check_space,
    inline_elementwise,
    row_reduce,
)

KIND = "attention"
PRECISION = "fp32"
SPACE = {
    "tile_rows": [1, 2, 4, 6, 8],
    "tile_n": [16, 32, 64, 128],
    "vector_lanes": [4, 8, 16],
    "parallel": [True, False],
}
DEFAULT = {"tile_rows": 4, "tile_n": 64, "vector_lanes": 16, "parallel": True}


def dims(task: Task) -> tuple[int, int, int, int, int]:
    """(batch, heads, queries, keys, head_dim)."""
    batch, heads, seq, head_dim = task.inputs[0].shape
    keys = task.inputs[2].shape[2]
    return batch, heads, seq, keys, head_dim


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    if task.attr("softcap"):
        return "soft-capped logits (tanh) are not implemented by this template"
    if task.inputs[2].shape[-1] != task.inputs[0].shape[-1]:
        return f"values {task.inputs[2].shape[-1]} wide, keys {task.inputs[0].shape[-1]}: one head dim serves both here"
    facts = HostFacts.of(target)
    _, _, _, keys, head_dim = dims(task)
    rows, tile_n, lanes = config["tile_rows"], config["tile_n"], config["vector_lanes"]
    reason = check_lanes(lanes, facts)
    if reason:
        return reason
    if tile_n > SPACE["tile_n"][0] and tile_n > keys:
        return f"tile_n={tile_n} exceeds the {keys} keys: the smallest tile holds them already"
    if head_dim % lanes:
        return f"head_dim {head_dim} is not a multiple of vector_lanes={lanes}"
    if tile_n % lanes:
        return f"tile_n={tile_n} is not a multiple of vector_lanes={lanes}"
    return check_registers(rows, tile_n, lanes, facts) or check_registers(rows, head_dim, lanes, facts)


def _mask_shape(task: Task) -> tuple[int, ...]:
    shape = tuple(task.inputs[3].shape)
    return (1,) * (4 - len(shape)) + shape


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    batch, heads, seq, keys, head_dim = dims(task)
    rows, tile_n, lanes = config["tile_rows"], config["tile_n"], config["vector_lanes"]
    total_rows, pairs = batch * heads * seq, batch * heads
    scale = float(task.attr("scale", 1.0))
    k_transposed = bool(task.attr("k_transposed"))

    q = te.placeholder((total_rows, head_dim), "float32", name="q")
    k = te.placeholder((pairs, head_dim, keys) if k_transposed else (pairs, keys, head_dim), "float32", name="k")
    v = te.placeholder((pairs, keys, head_dim), "float32", name="v")
    args = [q, k, v]
    mask = te.placeholder(_mask_shape(task), "float32", name="mask") if task.attr("mask") else None
    if mask is not None:
        args.append(mask)

    # keys padded to whole tiles: a padded key's score is the lowest float (its weight exp() = 0)
    # and its k, v and mask reads are clamped to the last key, so nothing reads out of bounds
    padded = -(-keys // tile_n) * tile_n
    lowest = tvm.tirx.min_value("float32")

    def key(j: Any) -> Any:
        return te.min(j, keys - 1) if padded > keys else j

    if k_transposed and padded == keys:
        k_cols = k
    else:
        k_cols = te.compute((pairs, head_dim, padded),
                            lambda p, d, j: k[p, d, key(j)] if k_transposed else k[p, key(j), d], name="k_packed")
    d = te.reduce_axis((0, head_dim), name="d")
    raw = te.compute((total_rows, padded), lambda r, j: te.sum(q[r, d] * k_cols[r // seq, d, j], axis=d),
                     name="raw")

    def score(r: Any, j: Any) -> Any:
        value = raw[r, j] * scale
        if mask is not None:
            index = (r // (heads * seq), r // seq % heads, r % seq, key(j))
            value = value + mask[tuple(0 if size == 1 else i for size, i in zip(mask.shape, index))]
        if task.attr("causal"):
            value = te.if_then_else(j <= r % seq + (keys - seq), value, lowest)
        elif padded > keys:
            value = te.if_then_else(j < keys, value, lowest)
        return value

    row_max = row_reduce(score, total_rows, padded, lanes, "max", "row_max")
    exp = topi.fast_exp(te.compute((total_rows, padded), lambda r, j: score(r, j) - row_max[r], name="shifted"))
    row_sum = row_reduce(lambda r, j: exp[r, j], total_rows, padded, lanes, "sum", "row_sum")
    j = te.reduce_axis((0, padded), name="j")
    weighted = te.compute((total_rows, head_dim),
                          lambda r, c: te.sum(exp[r, j] * v[r // seq, key(j), c], axis=j), name="weighted")
    out = te.compute((total_rows, head_dim), lambda r, c: weighted[r, c] / row_sum[r], name="out")

    sch = s_tir.Schedule(te.create_prim_func([*args, out]))
    exp_name = exp.op.name
    inline_elementwise(sch, keep=("k_packed", "raw", "row_max_lanes", "row_max", exp_name, "row_sum_lanes",
                                  "row_sum", "weighted", "out"))
    out_block = sch.get_sblock("out")
    r_task, _ = sch.split(sch.get_loops(out_block)[0], [None, rows])
    if config["parallel"]:
        sch.parallel(r_task)
    sch.vectorize(sch.split(sch.get_loops(out_block)[-1], [None, lanes])[1])
    for name in ("weighted", "row_sum", "row_sum_lanes", exp_name, "row_max", "row_max_lanes", "raw"):
        sch.compute_at(sch.get_sblock(name), r_task, preserve_unit_loops=True)

    block = sch.get_sblock("weighted")  # (row, c, j): j outside a rows x head_dim register tile
    r_reg, c, jj = sch.get_loops(block)[-3:]
    c_unrolled, c_vector = sch.split(c, [None, lanes])
    sch.reorder(jj, r_reg, c_unrolled, c_vector)
    sch.vectorize(c_vector)
    sch.unroll(r_reg)
    sch.unroll(c_unrolled)
    sch.decompose_reduction(block, jj)
    for name in ("row_max_lanes", "row_sum_lanes"):  # (row, lane, step): step outside the lane vector
        lane_block = sch.get_sblock(name)
        row, lane, step = sch.get_loops(lane_block)[-3:]
        sch.reorder(row, step, lane)
        sch.vectorize(lane)
    sch.vectorize(sch.split(sch.get_loops(sch.get_sblock(exp_name))[-1], [None, lanes])[1])

    raw_block = sch.get_sblock("raw")
    row, col, dd = sch.get_loops(raw_block)[-3:]
    col_tile, col_reg = sch.split(col, [None, tile_n])
    col_unrolled, col_vector = sch.split(col_reg, [None, lanes])
    sch.reorder(col_tile, dd, row, col_unrolled, col_vector)
    sch.vectorize(col_vector)
    sch.unroll(row)
    sch.unroll(col_unrolled)
    sch.decompose_reduction(raw_block, dd)

    if k_cols is not k:
        pair = sch.get_loops(sch.get_sblock("k_packed"))[0]
        if config["parallel"]:
            sch.parallel(pair)

    shapes = [(total_rows, head_dim), tuple(k.shape), (pairs, keys, head_dim)]
    shapes += [_mask_shape(task)] if mask is not None else []
    return Kernel(sch.mod, (*(tuple(int(x) for x in s) for s in shapes), (total_rows, head_dim)))
