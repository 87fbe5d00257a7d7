"""RMSNorm over the last axis on CUDA GPUs: the sum of squares as a cross-thread reduction over
threads_per_row threads, rows_per_block rows per block.

The computation is ../layernorm.py's rmsnorm_computation (one TE definition with the CPU's
../rmsnorm.py). cache_row reads the block's rows of x into shared memory once (two
passes, one global read).
"""
from __future__ import annotations

from .. import layernorm
from ..common import check_gamma
from .common import ROW_DEFAULT, ROW_SPACE, row_template, row_threads

KIND = "rmsnorm"
PRECISION = "fp32"
SPACE = ROW_SPACE
DEFAULT = ROW_DEFAULT
threads = row_threads  # threads per block of a configuration
REDUCTIONS = 1  # cross-thread reductions per row
constraints, schedule = row_template(
    layernorm.rmsnorm_computation, layernorm.dims,
    keep=("row_sq", "out"), reductions=REDUCTIONS, check_task=check_gamma)
