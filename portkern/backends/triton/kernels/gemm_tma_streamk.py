"""Stream-K GEMM over TMA tiles: the K-steps of the output tiles, not the tiles, shared out evenly.

When the output tiles do not fill a whole number of waves (4096x768 in 128x256 tiles is 96 tiles
for 132 SMs; in 128x128 tiles, 1.45 waves), a persistent GEMM leaves SMs idle for the last wave.
Here every program (one per SM) takes an equal run of the streamed tiles' K-steps. A tile whose
steps fall to several programs is finished by the one holding its last step: the others store
their fp32 partial tile in a workspace slot of their own (a program ends at most one tile early,
so one slot each) and raise their flag; the finisher waits for the flags of the earlier programs,
adds their partials in program order (deterministic), resets the flags to zero for the next call,
and runs the epilogue. A program walks its run from the last tile down, so the partial it owes a
later program is stored first and the tile it finishes, waiting on earlier programs, comes last.

STREAMED="all" streams every tile; "tail" keeps whole waves data-parallel (gemm_tma's loop) and
streams the last partial wave with one whole wave before it, which is what splits evenly.
Waiting on another program is safe because a finisher waits only on lower program ids, which the
GPU schedules no later (the interpreter runs programs in id order). The workspace's flags are
int32 counters the backend allocates zeroed; the kernel leaves them at zero.
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# include: gemm_tma

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128],
         "GROUP_M": [1, 8], "NUM_SMS": [58, 108, 132, 304], "STREAMED": ["all", "tail"],
         "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132, "STREAMED": "all",
           "num_warps": 8, "num_stages": 3}


def constraints(task, config, target):
    return (_tma_problem(task, target) or _sms_problem(config, target) or _residual_problem(task)
            or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target))


def _streamed_tiles(tiles, programs, streamed):
    """How many tiles (the first ones in tile order) are shared out by K-steps."""
    if streamed == "all" or tiles <= programs:
        return tiles
    last_wave = tiles % programs
    return last_wave + programs if last_wave else 0


def scratch(task, config):
    """One fp32 partial tile and one flag per program."""
    programs = config["NUM_SMS"]
    return [((programs, config["BLOCK_M"], config["BLOCK_N"]), "float32"), ((programs,), "int32")]


@triton.jit
def _finish_partials(acc, partials_ptr, flags_ptr, first_program, program, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """acc plus the partial tiles of programs first_program..program-1, each taken once its flag
    is up (and the flag put back to zero), in program order."""
    offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for other in range(first_program, program):
        while tl.atomic_cas(flags_ptr + other, 1, 0, sem="acquire", scope="gpu") != 1:
            pass
        acc += tl.load(partials_ptr + other * BLOCK_M * BLOCK_N + offsets, cache_modifier=".cg")
    return acc


@triton.jit
def _owe_partial(acc, partials_ptr, flags_ptr, program, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store this program's partial tile in its slot, then raise its flag."""
    offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(partials_ptr + program * BLOCK_M * BLOCK_N + offsets, acc, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's part of the tile is written before the flag goes up
    tl.atomic_xchg(flags_ptr + program, 1, sem="release", scope="gpu")


@triton.jit
def _gemm_tma_streamk(a_desc, b_desc, c_ptr, bias_ptr, res_ptr, partials_ptr, flags_ptr, M, N, K, streamed_tiles,
                      stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, B_TRANSPOSED: tl.constexpr,
                      ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    k_steps = tl.cdiv(K, BLOCK_K)
    streamed_steps = streamed_tiles * k_steps
    per_program = tl.cdiv(streamed_steps, programs)
    first = program * per_program
    last = tl.minimum(first + per_program, streamed_steps)
    run_tiles = tl.where(first < last, (last - 1) // k_steps - first // k_steps + 1, 0)
    for i in range(run_tiles):
        tile = (last - 1) // k_steps - i
        tile_first = tile * k_steps
        lo = tl.maximum(first, tile_first)
        hi = tl.minimum(last, tile_first + k_steps)
        block_m, block_n = _swizzle(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _tma_tile_dot(a_desc, b_desc, block_m * BLOCK_M, block_n * BLOCK_N, (lo - tile_first) * BLOCK_K,
                            (hi - tile_first) * BLOCK_K, BLOCK_M, BLOCK_N, BLOCK_K, B_TRANSPOSED)
        if hi < tile_first + k_steps:
            _owe_partial(acc, partials_ptr, flags_ptr, program, BLOCK_M, BLOCK_N)
        else:
            acc = _finish_partials(acc, partials_ptr, flags_ptr, tile_first // per_program, program, BLOCK_M,
                                   BLOCK_N)
            rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
            _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                            stride_rn, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in range(streamed_tiles + program, tiles, programs):
        block_m, block_n = _swizzle(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _tma_tile_dot(a_desc, b_desc, block_m * BLOCK_M, block_n * BLOCK_N, 0, K, BLOCK_M, BLOCK_N, BLOCK_K,
                            B_TRANSPOSED)
        rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
        _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                        stride_rn, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    a_desc = TensorDescriptor(inputs[0], [p.M, p.K], list(p.stride_a), [block_m, block_k])
    b_desc = _b_descriptor(task, p, inputs[1], _stored_b_strides(task, p), block_n, block_k)
    programs = config["NUM_SMS"]
    streamed = _streamed_tiles(triton.cdiv(p.M, block_m) * triton.cdiv(p.N, block_n), programs, config["STREAMED"])
    partials, flags = outputs[1], outputs[2]
    _gemm_tma_streamk[(programs,)](
        a_desc, b_desc, outputs[0], p.bias, p.residual, partials, flags, p.M, p.N, p.K, streamed, *p.stride_c,
        *p.stride_r, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=config["GROUP_M"],
        B_TRANSPOSED=bool(task.attr("trans_b", False)), **p.epilogue, num_warps=config["num_warps"],
        num_stages=config["num_stages"])
