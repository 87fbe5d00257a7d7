"""Fused attention forward (flash-attention style): softmax(q k^T * scale + mask) v in one pass.

A program owns BLOCK_M query rows of one (batch, head), or with PACK_GQA (grouped-query attention)
the rows of a key/value head's whole group of query heads at BLOCK_M / group positions each
(FlashAttention-3's PackGQA: where a head has fewer positions than a tile has rows, the padding
rows become the group's other heads, and K and V are read once a group), and walks the keys
BLOCK_N at a time with an online softmax (running max and sum, rescaled in the exp2 domain), so
the S x Sk score matrix never reaches memory. The mask is additive and broadcast through zero strides; causal masking is
bottom-right aligned and skips key blocks that are fully masked; k_transposed and the folded
head-split/merge Transposes (perms) are strides. TMA reads the K and V tiles through 4-D tensor
descriptors (sm_90: asynchronous copies, no address arithmetic, edges zero-filled by the copy).
fp32 inputs use exact fp32 products; fp16/bf16 feed the probabilities to the second product in
the input dtype.
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

KIND = "attention"
PRECISION = "fp32"
DOT_PRECISION = "ieee"

# include: attention_flash
