"""GEMM tiled like gemm_tiled, with fp32 inputs on tensor cores as three tf32 products (tf32x3).

The split and its accuracy are gemm_tma_tf32x3's (fp32 tolerance, the tensor cores doing the
work); this one reads operands through pointers, so any alignment and any arch with tf32 (sm_80+).
"""
import math

import triton
import triton.language as tl

KIND = "gemm"
PRECISION = "fp32"
DOT_PRECISION = "tf32x3"

# include: gemm_tiled
