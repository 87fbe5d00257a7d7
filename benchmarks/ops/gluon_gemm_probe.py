"""Does gemm_wgmma's 192-row tile close the fp16 GEMM gap to cuBLAS on Hopper? A probe.

gemm_tma reaches 0.85-0.91x cuBLAS at 4096x768x3072 (BERT's FFN down-projection). cuBLAS runs that
shape in 192x128 tiles: 22 x 6 = 132 tiles, one per SM of an H100/H200, every SM busy for one
round. Triton's tiles are powers of two (128x256: 96 tiles, 36 SMs idle; 64x128: 384 tiles in 2.9
rounds of a 64-row tile's lower intensity), and a Triton loop with two products (gemm_tma WIDE,
N_PARTS) waits on each wgmma on its own, which made those 1.2-1.7x slower. gemm_wgmma (Gluon) issues
wgmma asynchronously, so its 192-row tile is a 128-row and a 64-row product in flight together on
one B tile; BLOCK_M=128 is the same kernel with one product, the control.

This file checks gemm_wgmma's configs against a float32 product and times them beside cuBLAS
(torch's linear) and gemm_tma's best measured configs on the issue's GEMM shapes, each as
portkern's compiled program: do_bench (L2 flushed between calls) and do_bench_cudagraph (launches
in a CUDA graph, L2 warm). Its first run, with the kernel still in this file, is
results/h100-gluon-gemm-probe-2026-12-06.log.

    python benchmarks/ops/gluon_gemm_probe.py --compile-only    # no GPU: builds for sm_90
    bash benchmarks/gpu_run.sh python3 benchmarks/ops/gluon_gemm_probe.py --out $OUT/probe.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from portkern.backends.triton.compile_only import compile_for
from portkern.synthetic import gemm_task
from portkern.tasks import Task

sys.path.insert(0, str(Path(__file__).parent))
from _gluon_probe import built, candidate, program, write_record  # noqa: E402

SHAPES = [(4096, 768, 768), (4096, 3072, 768), (4096, 768, 3072), (4096, 4096, 4096), (4096, 11008, 4096)]
ODD_SHAPES = [(1000, 200, 136), (333, 520, 64)]  # rows, columns and K steps cut by every edge, checked only
_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")
CONFIGS = [dict(zip(_KEYS, values), GROUP_M=8) for values in (  # 192-row tiles, then the 128-row control
    (192, 128, 64, 4, 4), (192, 128, 64, 3, 4), (192, 128, 32, 5, 4), (192, 64, 64, 4, 4), (192, 128, 64, 4, 8),
    (192, 128, 64, 5, 8), (192, 256, 64, 2, 8), (128, 128, 64, 4, 8), (128, 256, 64, 3, 8), (128, 128, 64, 4, 4))]
# gemm_tma's best measured configs on these shapes (H200 priors; 128x256 was the H100's best at
# 4096x768x3072), timed beside it
TMA_BEST = {
    SHAPES[0]: [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "num_stages": 4, "num_warps": 4}],
    SHAPES[1]: [{"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}],
    SHAPES[2]: [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1, "num_stages": 4, "num_warps": 4},
                {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}],
    SHAPES[3]: [{"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 3, "num_warps": 8}],
    SHAPES[4]: [{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_stages": 5, "num_warps": 4}]}


def _linear(shape: tuple[int, int, int]) -> Task:
    """The linear-layer GEMM of this shape (weight N x K)."""
    return gemm_task(*shape, "float16", trans_b=True)


def _tma_config(config: dict[str, Any]) -> dict[str, Any]:
    """gemm_tma's measured tile, persistent on every SM, FLATTEN and TMA_STORE on."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    return {**config, "NUM_SMS": sms, "FLATTEN": True, "TMA_STORE": True}


def compile_only(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Build each gemm_wgmma config for sm_90 on this machine (no GPU): registers, spills, shared memory."""
    results = []
    for config in configs:
        task = _linear(SHAPES[2])
        wgmma = candidate(task, "gemm_wgmma", config)
        row = {**config, **built(lambda: compile_for(wgmma, task, "sm_90")["kernels"][0])}
        print(row, flush=True)
        results.append(row)
    return results


def run_on_gpu(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
        name = f"{m}x{n}x{k}"
        cublas_ms = cublas_graph_ms = None
        if timed:
            cublas_ms = do_bench(lambda: torch.nn.functional.linear(a, weight), warmup=25, rep=200)
            cublas_graph_ms = do_bench_cudagraph(lambda: torch.nn.functional.linear(a, weight), rep=200)
            print(f"{name}: cuBLAS {cublas_ms * 1e3:.1f} us ({flops / cublas_ms / 1e9:.0f} TFLOP/s), "
                  f"in a CUDA graph {cublas_graph_ms * 1e3:.1f} us", flush=True)
        else:
            print(f"{name}: check only", flush=True)
        out = torch.empty(m, n, device="cuda", dtype=torch.float16)
        variants = [("gemm_wgmma", config) for config in configs] + [
            ("gemm_tma", _tma_config(c)) for c in TMA_BEST.get(shape, [])]
        for variant, config in variants:
            row: dict[str, Any] = {"shape": name, "variant": variant, "config": config, "cublas_ms": cublas_ms}
            try:
                loaded = program(_linear(shape), variant, config)
                run: Callable[[], None] = lambda: loaded([a, weight], [out])  # noqa: E731
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


def launch_once(shape: tuple[int, int, int], configs: list[dict[str, Any]]) -> None:
    """One launch of cuBLAS (torch's linear), each gemm_wgmma config and gemm_tma's best on one
    shape, nothing timed: the program to run under Nsight Compute."""
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    torch.nn.functional.linear(a, weight)
    for variant, config in [("gemm_wgmma", c) for c in configs] + [("gemm_tma", _tma_config(c))
                                                                    for c in TMA_BEST.get(shape, [])]:
        program(_linear(shape), variant, config)([a, weight], [out])
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true", help="build for sm_90 here; no GPU needed")
    parser.add_argument("--launch-once", metavar="MxNxK",
                        help="launch cuBLAS and the first two gemm_wgmma configs once on this shape, for ncu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.launch_once:
        launch_once(tuple(int(x) for x in args.launch_once.split("x")), CONFIGS[:2])
        return
    rows = compile_only(CONFIGS) if args.compile_only else run_on_gpu(CONFIGS)
    write_record(args.out, "gemm_wgmma: 192-row tiles as a 128-row and a 64-row product in flight together", rows)

if __name__ == "__main__":
    main()
