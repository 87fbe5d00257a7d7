"""Softmax over the last axis on CUDA GPUs: a block of rows_per_block rows, threads_per_row threads
along each row, the max and the sum as cross-thread reductions.

The computation is the CPU template's (../softmax.py) with plain (lanes=1) reductions; exp(x - max)
is recomputed for the sum and for the output rather than stored. cache_row reads the block's rows
of x into shared memory once (three passes, one global read); vector_width floats per thread and
step in the stores and the shared copy.
"""
from __future__ import annotations

from .. import softmax
from .common import ROW_DEFAULT, ROW_SPACE, row_template, row_threads

KIND = "softmax"
PRECISION = "fp32"
SPACE = ROW_SPACE
DEFAULT = ROW_DEFAULT
threads = row_threads  # threads per block of a configuration
REDUCTIONS = 2  # cross-thread reductions per row
constraints, schedule = row_template(
    softmax.computation, softmax.dims,
    keep=("row_max", "row_sum", "out"), reductions=REDUCTIONS)
