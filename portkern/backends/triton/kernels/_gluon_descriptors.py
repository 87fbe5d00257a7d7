# --- included from _gluon_descriptors.py: Gluon TMA descriptors over fp16/bf16 tensors, wgmma's
# accumulator layout ---
_GL_DTYPES = {"float16": gl.float16, "bfloat16": gl.bfloat16}
_LAYOUTS = {}  # (block, dtype) -> shared layout: 8 us of host time each, several per launch


def _descriptor(t, shape, strides, block, dtype):
    """A descriptor over t read as `shape` with `strides`, in `block` tiles (the shared layout
    wgmma reads them in)."""
    key = (tuple(block), dtype)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])
    return GluonDescriptor(t, list(shape), list(strides), list(block), _LAYOUTS[key])


def _byte_alignment(*offsets):
    """The bytes (16 at most) that a pointer and its strides in bytes are all multiples of: a
    worker partition of gl.warp_specialize does not see the divisibility the JIT gave its
    arguments (Triton 3.6), so a kernel passes this and restates it with gl.multiple_of."""
    return min([16, *(offset & -offset for offset in offsets if offset)])  # the lowest set bit of each


@triton.constexpr_function
def _wgmma_layout(warps_m, warps_n, columns):
    """The register layout of a wgmma accumulator (or of what is laid out like one): warps_m x warps_n
    warps over the tile, `columns` columns an instruction."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps_m, warps_n], instr_shape=[16, columns, 16])
