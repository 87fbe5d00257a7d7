"""GEMM tiled like gemm_tiled, but fp32 inputs go through tensor cores as tf32 (10-bit mantissa
products, fp32 accumulation): several times faster, and it promises only tf32 accuracy.
"""
import math

import triton
import triton.language as tl

KIND = "gemm"
PRECISION = "tf32"
DOT_PRECISION = "tf32"

# include: gemm_tiled
