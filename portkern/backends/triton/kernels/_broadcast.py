# --- included from _broadcast.py: an operand read as if broadcast, through zero strides ---
def _strides4(t, shape4):
    """Strides of t broadcast to a 4-D shape: size-1 (or missing) dims get stride 0."""
    pad = len(shape4) - len(t.shape)
    sizes = (1,) * pad + tuple(t.shape)
    strides = (0,) * pad + tuple(t.stride())
    return tuple(0 if size == 1 else stride for size, stride in zip(sizes, strides, strict=True))
