"""Does a 192-row GEMM tile close the fp16 GEMM gap to cuBLAS on Hopper? A probe.

gemm_tma reaches 0.85-0.91x cuBLAS at 4096x768x3072 (BERT's FFN down-projection). cuBLAS runs that
shape in 192x128 tiles: 22 x 6 = 132 tiles, one per SM of an H100/H200, every SM busy for one
round. Triton's tiles are powers of two (128x256: 96 tiles, 36 SMs idle; 64x128: 384 tiles in 2.9
rounds of a 64-row tile's lower intensity), and a Triton loop with two products (gemm_tma WIDE,
N_PARTS) waits on each wgmma on its own, which made those 1.2-1.7x slower. Gluon issues wgmma
asynchronously and waits where the kernel says, so a 192-row tile can be two products in flight per
K step: a 128-row accumulator (one 64-row slice per warpgroup) and a 64-row one (each warpgroup
half of its columns), both reading the same B tile from a TMA ring.

This file holds that kernel (fp16/bf16, C = A B^T with B stored N x K as a linear layer's weight,
TMA loads and stores clipped at every edge), checks it against a float32 product and times it
beside cuBLAS (torch's linear) and gemm_tma's best measured config on the issue's GEMM shapes with
do_bench. TAIL=0 is the same kernel without the 64-row part: the control. Nothing in portkern uses
it yet: this decides whether a Gluon GEMM variant is worth building (Gluon kernels cannot run in
the Triton interpreter the tests use).

    python benchmarks/ops/gluon_gemm_probe.py --compile-only    # no GPU: builds for sm_90
    bash benchmarks/gpu_run.sh python3 benchmarks/ops/gluon_gemm_probe.py --out $OUT/probe.json
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HEAD_ROWS = 128  # the first accumulator's rows; TAIL adds a second accumulator below it
SHAPES = [(4096, 768, 768), (4096, 3072, 768), (4096, 768, 3072), (4096, 4096, 4096), (4096, 11008, 4096)]
ODD_SHAPES = [(1000, 200, 136), (333, 520, 64)]  # rows, columns and K steps cut by every edge, checked only
CONFIGS = [  # TAIL (0 or 64 rows), BLOCK_N, BLOCK_K, STAGES, num_warps
    (64, 128, 64, 4, 8), (64, 128, 64, 5, 8), (64, 128, 64, 3, 8), (64, 128, 128, 2, 8), (64, 256, 64, 2, 8), (64, 128, 64, 4, 4),
    (0, 128, 64, 4, 8), (0, 256, 64, 3, 8), (0, 128, 128, 3, 8)]
# gemm_tma's best measured configs on these shapes (H200 priors; 128x256 was the H100's best at
# 4096x768x3072), timed beside it
TMA_BEST = {
    SHAPES[0]: [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_stages": 4, "num_warps": 4}],
    SHAPES[1]: [{"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}],
    SHAPES[2]: [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1, "num_stages": 4, "num_warps": 4},
                {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}],
    SHAPES[3]: [{"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}],
    SHAPES[4]: [{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 5, "num_warps": 4}]}


@gluon.jit
def _load_step(a_desc, tail_desc, b_desc, a_smem, tail_smem, b_smem, bars, step, n_steps, off_m, off_n,
               TAIL: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copies of K step `step` into its ring slot (nothing past the last step)."""
    slot = step % STAGES
    bar = bars.index(slot)
    pred = step < n_steps
    k = step * a_desc.block_type.shape[1]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    if TAIL > 0:
        mbarrier.expect(bar, nbytes + tail_desc.block_type.nbytes, pred=pred)
    else:
        mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a_smem.index(slot), pred=pred)
    if TAIL > 0:
        tma.async_copy_global_to_shared(tail_desc, [off_m + a_desc.block_type.shape[0], k], bar,
                                        tail_smem.index(slot), pred=pred)
    tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_smem.index(slot), pred=pred)


@gluon.jit
def _store_tile(c_desc, acc, off_m, off_n):
    """Registers -> shared -> global through TMA (clipped at C's edges)."""
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)


@gluon.jit
def _gemm_rows(a_desc, tail_desc, b_desc, c_desc, c_tail_desc, N, K, TAIL: gl.constexpr, STAGES: gl.constexpr,
               num_warps: gl.constexpr):
    """One (HEAD_ROWS + TAIL) x BLOCK_N tile of C = A B^T per program."""
    dtype: gl.constexpr = a_desc.dtype
    head: gl.constexpr = a_desc.block_type.shape[0]
    block_n: gl.constexpr = b_desc.block_type.shape[0]
    block_k: gl.constexpr = a_desc.block_type.shape[1]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, block_n, 16])
    # 64 rows are one warpgroup's height: with two warpgroups each takes half of the columns
    tail_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                                          instr_shape=[16, block_n // (num_warps // 4), 16])

    n_tiles_n = gl.cdiv(N, block_n)
    off_m = (gl.program_id(0) // n_tiles_n) * (head + TAIL)
    off_n = (gl.program_id(0) % n_tiles_n) * block_n
    n_steps = gl.cdiv(K, block_k)

    a_smem = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    tail_smem = a_smem
    if TAIL > 0:
        tail_smem = gl.allocate_shared_memory(dtype, [STAGES] + tail_desc.block_type.shape, tail_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES - 1):
        _load_step(a_desc, tail_desc, b_desc, a_smem, tail_smem, b_smem, bars, i, n_steps, off_m, off_n, TAIL,
                   STAGES)

    acc = gl.zeros([head, block_n], gl.float32, layout=acc_layout)
    tail_acc = gl.zeros([TAIL if TAIL > 0 else 64, block_n], gl.float32, layout=tail_layout)
    for step in range(n_steps):
        slot = step % STAGES
        mbarrier.wait(bars.index(slot), (step // STAGES) & 1)
        b_tile = b_smem.index(slot).permute((1, 0))
        acc = warpgroup_mma(a_smem.index(slot), b_tile, acc, is_async=True)
        if TAIL > 0:
            tail_acc = warpgroup_mma(tail_smem.index(slot), b_tile, tail_acc, is_async=True)
            # this step's two products stay in flight; the previous step's are done, so its slot refills
            acc, tail_acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc, tail_acc))
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        _load_step(a_desc, tail_desc, b_desc, a_smem, tail_smem, b_smem, bars, step + STAGES - 1, n_steps, off_m,
                   off_n, TAIL, STAGES)
    if TAIL > 0:
        acc, tail_acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, tail_acc))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    _store_tile(c_desc, acc, off_m, off_n)
    if TAIL > 0:
        # the compiler places both staging tiles at the same shared address (it does not see the
        # asynchronous store reading the first): wait until that store has read it
        tma.store_wait(0)
        _store_tile(c_tail_desc, tail_acc, off_m + head, off_n)
    tma.store_wait(0)


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float16 if t.dtype == torch.float16 else gl.bfloat16)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def _arguments(a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, config: tuple[int, ...]) -> dict[str, Any]:
    tail, block_n, block_k, _, _ = config
    tail_rows = tail if tail > 0 else 64  # a placeholder the kernel never uses
    return {"a_desc": _descriptor(a, [HEAD_ROWS, block_k]), "tail_desc": _descriptor(a, [tail_rows, block_k]),
            "b_desc": _descriptor(weight, [block_n, block_k]), "c_desc": _descriptor(out, [HEAD_ROWS, block_n]),
            "c_tail_desc": _descriptor(out, [tail_rows, block_n])}


def gemm_rows(a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, config: tuple[int, ...]) -> Callable[[], None]:
    """A launch of out = a @ weight.T for fp16/bf16 a (M x K) and weight (N x K), K contiguous, rows
    16-byte aligned; the descriptors are built once, so timing it times the kernel, not the host."""
    tail, block_n, _, stages, num_warps = config
    (m, k), n = a.shape, weight.shape[0]
    arguments = _arguments(a, weight, out, config)
    grid = (triton.cdiv(m, HEAD_ROWS + tail) * triton.cdiv(n, block_n), )
    return lambda: _gemm_rows[grid](**arguments, N=n, K=k, TAIL=tail, STAGES=stages, num_warps=num_warps)


def _label(config: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(("TAIL", "BLOCK_N", "BLOCK_K", "STAGES", "num_warps"), config))


def compile_only(configs: list[tuple[int, ...]]) -> list[dict[str, Any]]:
    """Build each config for sm_90 on this machine (no GPU): registers, spills, shared memory."""
    from portkern.backends.triton.compile_only import compile_gluon

    results = []
    for config in configs:
        a = torch.empty(4096, 3072, dtype=torch.float16, device="meta")
        weight = torch.empty(768, 3072, dtype=torch.float16, device="meta")
        out = torch.empty(4096, 768, dtype=torch.float16, device="meta")
        row: dict[str, Any] = _label(config)
        try:
            built = compile_gluon(_gemm_rows, _arguments(a, weight, out, config), {"N": "i32", "K": "i32"},
                                  {"TAIL": config[0], "STAGES": config[3], "num_warps": config[4]},
                                  num_warps=config[4])
            row.update(ok=True, **built)
        except Exception as exc:  # a config the compiler refuses is a result of the probe
            row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[-400:]}")
        print(row, flush=True)
        results.append(row)
    return results


def _tma_program(shape: tuple[int, int, int], config: dict[str, Any]) -> Any:
    """portkern's gemm_tma for this shape through the Triton backend (compiled, loaded)."""
    from portkern import synthetic
    from portkern.backends import get_backend
    from portkern.backends.base import Candidate
    from portkern.hwprofile import load_target

    backend = get_backend(load_target("h200"))
    task = synthetic.gemm_task(*shape, "float16", trans_b=True)
    variant = next(v for v in backend.variants(task) if v.name == "gemm_tma")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    full = {**variant.default, **config, "NUM_SMS": sms, "FLATTEN": True, "TMA_STORE": True}
    return backend.load(backend.compile(Candidate.of(variant, full), task), task)


def run_on_gpu(configs: list[tuple[int, ...]]) -> list[dict[str, Any]]:
    from triton.testing import do_bench, do_bench_cudagraph
    results = []
    for shape in SHAPES + ODD_SHAPES:
        m, n, k = shape
        gen = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
        weight = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / k ** 0.5
        reference = a.float() @ weight.float().T
        flops = 2 * m * n * k
        timed = shape in SHAPES
        cublas_ms = do_bench(lambda: torch.nn.functional.linear(a, weight), warmup=25, rep=200) if timed else None
        cublas_graph_ms = do_bench_cudagraph(lambda: torch.nn.functional.linear(a, weight), rep=200) if timed else None
        name = f"{m}x{n}x{k}"
        print(f"{name}: cuBLAS {cublas_ms * 1e3:.1f} us ({flops / cublas_ms / 1e9:.0f} TFLOP/s), "
              f"in a CUDA graph {cublas_graph_ms * 1e3:.1f} us" if timed
              else f"{name}: check only", flush=True)
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        candidates: list[tuple[Any, Callable[[], Any]]] = [
            (_label(config), gemm_rows(a, weight, out, config)) for config in configs]
        for config in TMA_BEST.get(shape, []):
            try:
                program = _tma_program(shape, config)
                candidates.append((("gemm_tma", config), lambda p=program: p([a, weight], [out])))
            except Exception as exc:
                print(f"    gemm_tma {config}: {type(exc).__name__}: {exc}", flush=True)
        for label, run in candidates:
            row: dict[str, Any] = {"shape": name, "kernel": str(label), "cublas_ms": cublas_ms}
            try:
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                error = ((out.float() - reference).norm() / reference.norm()).item()
                row["rel_l2"] = error
                if not error < 2e-3:  # fp16 output rounding is ~3e-4
                    row["status"] = "wrong"
                elif timed:
                    ms = do_bench(run, warmup=25, rep=200)
                    row.update(status="ok", ms=ms, tflops=flops / ms / 1e9, vs_cublas=cublas_ms / ms)
                    # inside a CUDA graph (no host work between launches, L2 left warm)
                    graph_ms = do_bench_cudagraph(run, rep=200)
                    row.update(graph_ms=graph_ms, graph_vs_cublas=cublas_graph_ms / graph_ms)
                else:
                    row["status"] = "ok"
            except Exception as exc:
                row.update(status="error", error=f"{type(exc).__name__}: {str(exc)[-300:]}")
            print("   ", {key: (round(value, 4) if isinstance(value, float) else value) for key, value in row.items()
                          if key not in ("shape", "cublas_ms")}, flush=True)
            results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true", help="build for sm_90 here; no GPU needed")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = compile_only(CONFIGS) if args.compile_only else run_on_gpu(CONFIGS)
    record = {"probe": "gluon GEMM, 192-row tiles as a 128-row and a 64-row product in flight together",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), "python": platform.python_version(), "torch": torch.__version__,
              "triton": triton.__version__,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (sm_90 cross-compile)",
              "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
