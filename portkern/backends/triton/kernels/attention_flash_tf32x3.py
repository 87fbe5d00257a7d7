"""attention_flash for fp32 inputs at fp32 accuracy: both products on tensor cores as tf32x3.

The scores (q k^T) and the output (p v) are each three tf32 products of a tf32 head/tail split of
their fp32 operands (gemm_tma_tf32x3 says why that keeps fp32 accuracy); the online softmax is
fp32 as in attention_flash, whose kernel, space and constraints this is.
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

KIND = "attention"
PRECISION = "fp32"
DOT_PRECISION = "tf32x3"

# include: attention_flash
