# --- included from _fast_math.py: fp32 reciprocal and tanh without libdevice (epilogues, attention
# scores) ---
@triton.jit
def _reciprocal(d):
    """1 / d for d >= 1, +inf included (0): rsqrt(d)^2 is one MUFU.RSQ and a multiply where fp32
    division compiles to about nine instructions (div.full's range fix-ups), within ~3e-7 relative
    error (div.full's is 2 ulp); activations in a GEMM epilogue run once per output element."""
    root = tl.math.rsqrt(d)
    return root * root


@triton.jit
def _tanh(x):
    # from e^-2|x| (never overflows); libdevice's tanh is outside the kernel contract
    z = tl.exp(-2.0 * tl.abs(x))
    magnitude = (1.0 - z) * _reciprocal(1.0 + z)
    return tl.where(x >= 0, magnitude, -magnitude)
