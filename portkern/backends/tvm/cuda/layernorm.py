"""LayerNorm over the last axis on CUDA GPUs: the mean and the centred sum of squares as
cross-thread reductions over threads_per_row threads, rows_per_block rows per block.

The computation is the CPU template's (../layernorm.py: two passes for the statistics, exact for
rows with a large mean) with plain (lanes=1) reductions. cache_row reads the block's rows of x
into shared memory once (three passes, one global read).
"""
from __future__ import annotations

from .. import layernorm
from ..common import check_gamma
from .common import ROW_DEFAULT, ROW_SPACE, row_template, row_threads

KIND = "layernorm"
PRECISION = "fp32"
SPACE = ROW_SPACE
DEFAULT = ROW_DEFAULT
threads = row_threads  # threads per block of a configuration
REDUCTIONS = 2  # cross-thread reductions per row
constraints, schedule = row_template(
    layernorm.computation, layernorm.dims,
    keep=("row_sum", "row_sq", "out"), reductions=REDUCTIONS, check_task=check_gamma)
