"""GEMM with misaligned operands: copy them to 16-byte aligned rows, then the TMA GEMM.

A K (or, for an untransposed B, an N) that is not a multiple of 8 16-bit elements leaves rows at
2-byte alignment: no 16-byte vector loads, no cp.async, no TMA, and vendor libraries fall to slow
paths (cuBLAS on 3000x1000x777: 74 TFLOP/s). One pass copies A and B into workspace rows whose
stride is rounded up to 16 bytes (each element read once, written once: a few microseconds),
and the TMA GEMM (gemm_tma's kernel) reads the copies. The copies hold only the valid elements:
the descriptors carry the logical sizes, so TMA zero-fills past K and N and never reads the
padding. The copy runs again on every call (nothing is cached between calls).
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# include: gemm_tma

KIND = "gemm"
PRECISION = "fp32"
DOT_PRECISION = "ieee"
COPY_ROWS, COPY_COLS = 8, 256  # one copy program's tile


def _aligned(n, item):
    per_row = _ROW_BYTES // item
    return triton.cdiv(n, per_row) * per_row


def _copy_shapes(task):
    """(rows, stored row length, aligned row length) of A and of B as stored."""
    item = _item_bytes(task)
    M, N, K = _gemm_dims(task)
    b_rows, b_cols = (N, K) if task.attr("trans_b", False) else (K, N)
    return (M, K, _aligned(K, item)), (b_rows, b_cols, _aligned(b_cols, item))


def constraints(task, config, target):
    problem = _tma_arch_problem(target) or _tma_dtype_problem(task)
    if problem:
        return problem
    if not _misaligned_rows(task):
        return "the operands' rows are 16-byte aligned already: gemm_tma reads them without a copy"
    return _tma_config_problem(task, config, target)


def scratch(task, config):
    dtype = task.inputs[0].dtype
    return [((rows, aligned), dtype) for rows, _, aligned in _copy_shapes(task)]


@triton.jit
def _copy_rows(a_ptr, a_copy, a_rows, a_cols, a_aligned, stride_am, stride_ak, b_ptr, b_copy, b_rows, b_cols,
               b_aligned, stride_br, stride_bc, a_programs, COPY_ROWS: tl.constexpr, COPY_COLS: tl.constexpr):
    """Programs [0, a_programs) copy A's tiles, the rest B's: one launch for both operands."""
    pid = tl.program_id(0)
    if pid < a_programs:
        _copy_tile(a_ptr, a_copy, pid, a_rows, a_cols, a_aligned, stride_am, stride_ak, COPY_ROWS, COPY_COLS)
    else:
        _copy_tile(b_ptr, b_copy, pid - a_programs, b_rows, b_cols, b_aligned, stride_br, stride_bc,
                   COPY_ROWS, COPY_COLS)


@triton.jit
def _copy_tile(src, dst, tile, rows, cols, aligned, stride_r, stride_c, COPY_ROWS: tl.constexpr,
               COPY_COLS: tl.constexpr):
    col_tiles = tl.cdiv(cols, COPY_COLS)
    r = (tile // col_tiles) * COPY_ROWS + tl.arange(0, COPY_ROWS)
    c = (tile % col_tiles) * COPY_COLS + tl.arange(0, COPY_COLS)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    values = tl.load(src + r[:, None].to(tl.int64) * stride_r + c[None, :] * stride_c, mask=mask)
    tl.store(dst + r[:, None].to(tl.int64) * aligned + c[None, :], values, mask=mask)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    (a_rows, a_cols, a_aligned), (b_rows, b_cols, b_aligned) = _copy_shapes(task)
    a_copy, b_copy = outputs[1], outputs[2]
    tiles = lambda rows, cols: triton.cdiv(rows, COPY_ROWS) * triton.cdiv(cols, COPY_COLS)
    a_programs = tiles(a_rows, a_cols)
    _copy_rows[(a_programs + tiles(b_rows, b_cols),)](
        inputs[0], a_copy, a_rows, a_cols, a_aligned, *p.stride_a, inputs[1], b_copy, b_rows, b_cols, b_aligned,
        *_stored_b_strides(task, p), a_programs, COPY_ROWS=COPY_ROWS, COPY_COLS=COPY_COLS, num_warps=4)
    _launch_tma(task, config, p, a_copy, (a_aligned, 1), b_copy, (b_aligned, 1), outputs[0])
