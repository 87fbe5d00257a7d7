"""Batched matmul like bmm_tiled, with fp32 inputs multiplied as tf32 on tensor cores (tf32 promise)."""
import math

import triton
import triton.language as tl

KIND = "bmm"
PRECISION = "tf32"
DOT_PRECISION = "tf32"

# include: bmm_tiled
