"""Batched matmul (attention scores, per-head projections): a tiled GEMM per batch, batch on grid axis 1.

Batch dims are flattened through strides (an operand shared by every batch gets stride 0); the
`scale` attribute is applied to the fp32 accumulator. fp32 inputs use exact fp32 products.
"""
import math

import triton
import triton.language as tl

KIND = "bmm"
PRECISION = "fp32"
DOT_PRECISION = "ieee"

# include: bmm_tiled
