# --- included from _gemm_common.py: GEMM operands, tile order, main loop, fused epilogue ---
# include: activation
# include: dot_precision


def _row_strides(t, what):
    """(row, column) strides of a tensor seen as rows x last dim; its leading dims must collapse."""
    shape, strides = t.shape, t.stride()
    for i in range(len(shape) - 2):
        if shape[i] != 1 and strides[i] != strides[i + 1] * shape[i + 1]:
            raise ValueError(f"{what}: leading dimensions {tuple(shape)} with strides {strides} do not "
                             "collapse into rows")
    return (strides[-2] if len(shape) >= 2 else 0), strides[-1]


class _GemmProblem:
    """A gemm task's operands as kernel arguments: batch dims flattened into M, trans_b as strides.

    Absent bias/residual pass `a` as a placeholder pointer that HAS_BIAS/RESIDUAL keep unread.
    RESIDUAL says how the last operand joins the epilogue: "none", "add" (a residual) or "mul" (a
    gate, as SwiGLU's silu(x @ W_gate) * up).
    """

    def __init__(self, task, inputs, outputs):
        a, b, out = inputs[0], inputs[1], outputs[0]
        self.K = a.shape[-1]
        self.N = out.shape[-1]
        self.M = math.prod(a.shape[:-1])
        has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
        b_strides = b.stride()
        self.stride_b = (b_strides[1], b_strides[0]) if task.attr("trans_b", False) else tuple(b_strides)
        self.stride_a = _row_strides(a, "a")
        self.stride_c = _row_strides(out, "output")
        self.bias = inputs[2] if has_bias else a
        self.residual = inputs[-1] if has_residual else a
        self.stride_r = _row_strides(self.residual, "residual") if has_residual else (0, 0)
        self.epilogue = {"ACTIVATION": task.attr("activation", "none"), "HAS_BIAS": has_bias,
                         "RESIDUAL": task.attr("residual_op", "add") if has_residual else "none"}


def _gemm_dims(task):
    """(M, N, K) of a gemm task, from its specs."""
    a, out = task.inputs[0].shape, task.outputs[0].shape
    return math.prod(a[:-1]), out[-1], a[-1]


def _one_program_an_sm(target):
    """NUM_SMS as a persistent kernel's fixed() pins it: the target's SM count, whatever SPACE lists."""
    return {"NUM_SMS": target.profile.cores}


def _sms_problem(config, target):
    """Persistent programs are launched one per SM: NUM_SMS is the target's count, nothing else."""
    if config["NUM_SMS"] != target.profile.cores:
        return f"NUM_SMS={config['NUM_SMS']} is not the target's SM count ({target.profile.cores})"
    return None


def _accumulator_problem(rows, cols, num_warps, target, limit=128):
    """An fp32 rows x cols accumulator over more than `limit` registers a thread spills (128; a
    module's _accumulator_limit() where its products need registers of their own)."""
    threads = num_warps * target.profile.warp_size
    if rows * cols > limit * threads:
        return f"a {rows}x{cols} fp32 accumulator over {threads} threads needs > {limit} registers each"
    return None


@triton.jit
def _swizzle(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile index -> (row block, column block), GROUP_M row blocks at a time so the B columns a
    group reads stay in L2 while its rows are swept."""
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * blocks_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = tl.minimum(blocks_m - first_m, GROUP_M)
    within = tile % per_group
    return first_m + within % group_rows, within // group_rows


@triton.jit
def _dot_tile(acc, a_ptr, b_ptr, rows, cols, M, N, k_lo, k_hi, stride_am, stride_ak, stride_bk,
              stride_bn, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc += A[rows, k_lo:k_hi] @ B[k_lo:k_hi, cols], masked at every edge."""
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows[:, None] < M
    col_ok = cols[None, :] < N
    a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + (k_lo + ks)[None, :] * stride_ak
    b_ptrs = b_ptr + (k_lo + ks)[:, None] * stride_bk + cols[None, :].to(tl.int64) * stride_bn
    for k in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k + ks) < k_hi
        a = tl.load(a_ptrs, mask=row_ok & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _epilogue(acc, bias_ptr, res_ptr, rows, cols, M, N, stride_rm, stride_rn, ACTIVATION: tl.constexpr,
              HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr):
    """act(acc + bias) + residual, or * it where RESIDUAL is "mul" (partition.py's gemm order), in fp32."""
    acc = _bias_activation(acc, bias_ptr, cols, N, ACTIVATION, HAS_BIAS)
    if RESIDUAL != "none":
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        other = tl.load(res_ptr + rows[:, None].to(tl.int64) * stride_rm + cols[None, :] * stride_rn, mask=mask,
                        other=0.0).to(tl.float32)
        acc = _join(acc, other, RESIDUAL)
    return acc


@triton.jit
def _join(acc, other, RESIDUAL: tl.constexpr):
    """The epilogue's last operand joined to acc: added (a residual) or multiplied (a gate)."""
    if RESIDUAL == "mul":
        acc = acc * other
    else:
        acc = acc + other
    return acc


@triton.jit
def _bias_activation(acc, bias_ptr, cols, N, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr):
    """act(acc + bias), the epilogue before its residual."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    return _activate(acc, ACTIVATION)


@triton.jit
def _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                    stride_rn, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr):
    """out = the epilogue of acc, then one masked store."""
    acc = _epilogue(acc, bias_ptr, res_ptr, rows, cols, M, N, stride_rm, stride_rn, ACTIVATION, HAS_BIAS,
                    RESIDUAL)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=mask)
