"""gemm_tma for fp32 operands at fp32 accuracy: TMA tiles, products on tensor cores as tf32x3.

Each fp32 operand is split into a tf32 head and tail (a = a_hi + a_lo) and the product is
a_hi*b_hi + a_hi*b_lo + a_lo*b_hi accumulated in fp32: only a_lo*b_lo (about 2^-22 of each
product) is dropped, so it is gated at fp32 tolerance like the ieee kernels, while the tensor cores
do the work (ieee fp32 products run as FMAs on the CUDA cores). Operand rows must be 16-byte
aligned (K, and N for an untransposed B, multiples of 4).
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

KIND = "gemm"
PRECISION = "fp32"
DOT_PRECISION = "tf32x3"

# include: gemm_tma_inplace

# fp32 tiles are twice gemm_tma's bytes, and the split keeps each operand's tf32 halves in shared
# memory too: its 128x256x64 default cannot fit, 128x128x32 can (131 KB compiled for sm_90)
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "NUM_SMS": 132,
           "FLATTEN": True, "TMA_STORE": False, "HALF_TAIL": False, "num_warps": 8, "num_stages": 3}
