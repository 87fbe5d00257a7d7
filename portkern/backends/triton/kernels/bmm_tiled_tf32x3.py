"""Batched matmul like bmm_tiled, with fp32 inputs as three tf32 products on tensor cores (tf32x3:
fp32 accuracy, see gemm_tma_tf32x3)."""
import math

import triton
import triton.language as tl

KIND = "bmm"
PRECISION = "fp32"
DOT_PRECISION = "tf32x3"

# include: bmm_tiled
