"""GEMM with a fused epilogue (bias, activation, residual): one program per output tile.

Tiles are visited GROUP_M row blocks at a time (L2 reuse of B); leading batch dims of `a` are
flattened into M and trans_b is a stride swap. fp32 inputs use exact fp32 products (ieee), so the
promise is fp32; fp16/bf16 accumulate in fp32.
"""
import math

import triton
import triton.language as tl

KIND = "gemm"
PRECISION = "fp32"
DOT_PRECISION = "ieee"

# include: gemm_tiled
