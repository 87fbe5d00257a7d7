"""GEMM fed by the Hopper tensor memory accelerator (TMA): persistent programs, tile descriptors.

TMA copies whole tiles into shared memory asynchronously and masks the edges in hardware, so the
main loop carries no address arithmetic and no masks, and wgmma reads its operands from shared
memory: the pipeline depth (num_stages) and the tile shape are what is left to tune. FLATTEN lets
Triton's pipeliner run one tile's loads under the previous tile's epilogue; HALF_TAIL runs the last
rows in half-height tiles so the programs' shares of tiles come out even (wave quantization). Needs
sm_90 or newer, rows of A and B contiguous and 16-byte aligned (K, and N for an untransposed B,
multiples of 8 for 16-bit data; gemm_tma_staged copies misaligned operands first); the epilogue
(bias, activation, residual) is gemm_tiled's.
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

KIND = "gemm"
PRECISION = "fp32"
DOT_PRECISION = "ieee"

# include: gemm_tma_inplace
