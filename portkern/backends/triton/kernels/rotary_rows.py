"""Rotary embedding, x * cos + rotate_half(x) * sin, BLOCK_ROWS rows of D a program.

Each row of x is one (batch, head, position); rotate_half is the same row read at the partner
column (the other half) with the first half negated, so x is read from memory once (the partner
load hits the same lines) and the result written once. x is read through strides: with the
head-split Transpose folded in (attrs perm) the heads are rotated in place in the projection's
(B, S, H, D) buffer and written (B, H, S, D), where attention reads them. cos and sin broadcast
through zero strides. A partial rotary (attrs rotary_dims R < D: GPT-NeoX, Phi) rotates the first
R columns and copies the rest, in the same pass. Interleaved (GPT-J, RoFormer) pairs each even
column with the odd one after it instead of the other half's. The arithmetic is fp32, rounded once at the store
(a copied column is x * 1 + 0 * 0: exactly x).
"""
import triton
import triton.language as tl

KIND = "rotary"
PRECISION = "fp32"
SPACE = {"BLOCK_ROWS": [1, 2, 4, 8, 16, 32], "num_warps": [1, 2, 4, 8]}
DEFAULT = {"BLOCK_ROWS": 8, "num_warps": 4}
MAX_ELEMENTS_PER_THREAD = 32  # x, its partner, cos and sin of a block in fp32 registers

# include: broadcast


def _view(task, buffer):
    """x as (B, H, S, D): the buffer itself, or permuted where the head split is folded in."""
    perm = task.attr("perm")
    return buffer.permute(*perm) if perm else buffer


def _rotary_dims(task):
    """R: the columns of each head that are rotated (the first R; all D unless partial)."""
    return task.attr("rotary_dims", task.outputs[0].shape[-1])


def constraints(task, config, target):
    dim = task.outputs[0].shape[-1]
    if _rotary_dims(task) % 2:
        return f"rotating pairs of columns needs an even number of them, not {_rotary_dims(task)}"
    threads = config["num_warps"] * target.profile.warp_size
    if config["BLOCK_ROWS"] * triton.next_power_of_2(dim) > MAX_ELEMENTS_PER_THREAD * threads:
        return f"{config['BLOCK_ROWS']} rows of {dim} over {threads} threads would spill"
    return None


@triton.jit
def _rotary_rows(x_ptr, cos_ptr, sin_ptr, out_ptr, ROWS, H, S, D, R, sx_b, sx_h, sx_s, sx_d, sc_b, sc_h, sc_s,
                 sc_d, ss_b, ss_h, ss_s, ss_d, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    b, h, s = rows // (H * S), rows // S % H, rows % S
    cols = tl.arange(0, BLOCK_D)
    if INTERLEAVED:  # pairs (2i, 2i + 1): the even column takes the odd one's negation
        partner = cols ^ 1
        negated = cols % 2 == 0
    else:  # halves: the first half takes the second's negation
        half = R // 2
        partner = tl.where(cols < half, cols + half, cols - half)
        negated = cols < half
    inside = (rows < ROWS)[:, None] & (cols < D)[None, :]
    turned = inside & (cols < R)[None, :]  # the rotated columns; the rest keep cos 1, sin 0
    x_row = (b * sx_b + h * sx_h + s * sx_s)[:, None]
    x = tl.load(x_ptr + x_row + cols[None, :] * sx_d, mask=inside, other=0.0).to(tl.float32)
    other = tl.load(x_ptr + x_row + partner[None, :] * sx_d, mask=turned, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + (b * sc_b + h * sc_h + s * sc_s)[:, None] + cols[None, :] * sc_d, mask=turned,
                  other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + (b * ss_b + h * ss_h + s * ss_s)[:, None] + cols[None, :] * ss_d, mask=turned,
                  other=0.0).to(tl.float32)
    rotated = tl.where(negated[None, :], -other, other)
    out = x * cos + rotated * sin
    tl.store(out_ptr + rows[:, None] * D + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    x, cos, sin = _view(task, inputs[0]), inputs[1], inputs[2]
    batch, heads, seq, dim = x.shape
    rows = batch * heads * seq
    rotated = _rotary_dims(task)
    angles = (batch, heads, seq, rotated)
    _rotary_rows[(triton.cdiv(rows, config["BLOCK_ROWS"]),)](
        x, cos, sin, outputs[0], rows, heads, seq, dim, rotated, *x.stride(), *_strides4(cos, angles),
        *_strides4(sin, angles), BLOCK_ROWS=config["BLOCK_ROWS"], BLOCK_D=triton.next_power_of_2(dim),
        INTERLEAVED=task.attr("interleaved", False), num_warps=config["num_warps"])
