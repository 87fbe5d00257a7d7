"""GroupNorm (+ its activation) on CUDA GPUs: the CPU template's computation (../groupnorm.py: a row
per sample and group of the NCHW view, two passes for the statistics, the affine per channel) with
plain (lanes=1) reductions, scheduled as layernorm.py's rows.
"""
from __future__ import annotations

from .. import groupnorm
from .common import ROW_DEFAULT, ROW_SPACE, row_template, row_threads

KIND = "groupnorm"
PRECISION = "fp32"
SPACE = ROW_SPACE
DEFAULT = ROW_DEFAULT
threads = row_threads  # threads per block of a configuration
REDUCTIONS = 2  # cross-thread reductions per row
constraints, schedule = row_template(
    groupnorm.computation, groupnorm.row_dims,
    keep=("row_sum", "row_sq", "out"), reductions=REDUCTIONS, check_task=groupnorm.layout_problem)
