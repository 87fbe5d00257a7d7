# --- included from _gluon_descriptors.py: Gluon TMA descriptors over fp16/bf16 tensors ---
_GL_DTYPES = {"float16": gl.float16, "bfloat16": gl.bfloat16}
_LAYOUTS = {}  # (block, dtype) -> shared layout: 8 us of host time each, several per launch


def _descriptor(t, shape, strides, block, dtype):
    """A descriptor over t read as `shape` with `strides`, in `block` tiles (the shared layout
    wgmma reads them in)."""
    key = (tuple(block), dtype)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(block), _GL_DTYPES[dtype])
    return GluonDescriptor(t, list(shape), list(strides), list(block), _LAYOUTS[key])
