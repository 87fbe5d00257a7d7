"""Does Triton's automatic warp specialization (tl.range(..., warp_specialize=True)) pay on Hopper?

A standalone probe, before any variant is built on it: the smallest flash-attention and persistent
TMA GEMM kernels that Triton 3.6/3.7 warp-specialize on sm_90 (checked by cross-compiling: device-made
tensor descriptors for every tile read, one key loop, no pointer loads inside the loop, num_warps=4;
the compiler then adds a producer warpgroup and splits the tile across two consumer warpgroups),
each timed with and without the flag over a small grid, side by side with torch's SDPA and cuBLAS
on the issue's shapes. Every output is checked against torch before its time is printed.

    bash benchmarks/gpu_run.sh python3 benchmarks/ops/warp_specialize_probe.py --out $OUT/ws-probe.json

Timing: triton.testing.do_bench (L2 flushed before every run, median), the same for both sides.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, H, S, sb, sh, ss, scale_log2, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, D: tl.constexpr, CAUSAL: tl.constexpr, WS: tl.constexpr):
    block = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    # (B, H, S, D) contiguous seen as B*H*S rows of D: a 2-D tile is what the compiler can split
    # between its two consumer warpgroups (a 4-D query tile fails to); S is a multiple of BLOCK_N
    rows_total = tl.num_programs(1) * S
    q_desc = tl.make_tensor_descriptor(q_ptr, [rows_total, D], [D, 1], [BLOCK_M, D])
    k_desc = tl.make_tensor_descriptor(k_ptr, [rows_total, D], [D, 1], [BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(v_ptr, [rows_total, D], [D, 1], [BLOCK_N, D])
    first = tl.program_id(1) * S
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    q = q_desc.load([first + block * BLOCK_M, 0])
    row_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    key_hi = tl.minimum(S, (block + 1) * BLOCK_M) if CAUSAL else S
    for start in tl.range(0, key_hi, BLOCK_N, warp_specialize=WS):
        k = k_desc.load([first + start, 0])
        scores = tl.dot(q, k.T) * scale_log2
        if CAUSAL:
            cols = start + tl.arange(0, BLOCK_N)
            scores = tl.where(cols[None, :] <= rows[:, None], scores, -float("inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        probs = tl.exp2(scores - new_max[:, None])
        rescale = tl.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(probs, 1)
        v = v_desc.load([first + start, 0])
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v)
        row_max = new_max
    out = acc / row_sum[:, None]
    tl.store(o_ptr + b.to(tl.int64) * sb + h * sh + rows[:, None] * ss + tl.arange(0, D)[None, :],
             out.to(o_ptr.dtype.element_ty), mask=(rows < S)[:, None])


@triton.jit
def _gemm(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          GROUP_M: tl.constexpr, WS: tl.constexpr):
    """C = A @ B^T, B stored N x K, persistent over output tiles in GROUP_M swizzle order."""
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), blocks_m * blocks_n, tl.num_programs(0), warp_specialize=WS):
        per_group = GROUP_M * blocks_n
        first_m = (tile // per_group) * GROUP_M
        group_rows = tl.minimum(blocks_m - first_m, GROUP_M)
        block_m = first_m + (tile % per_group) % group_rows
        block_n = (tile % per_group) // group_rows
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k in range(0, K, BLOCK_K):
            acc = tl.dot(a_desc.load([block_m * BLOCK_M, k]), b_desc.load([block_n * BLOCK_N, k]).T, acc)
        c_desc.store([block_m * BLOCK_M, block_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


def _row(name, flops, seconds, baseline, config):
    return {"case": name, "config": config, "us": seconds * 1e6, "tflops": flops / seconds / 1e12,
            "vs_vendor": baseline / seconds}


def attention_rows(sms):
    rows = []
    for b, h, s, d, causal in ((32, 12, 128, 64, False), (8, 12, 512, 64, False), (4, 32, 2048, 128, True)):
        name = f"attn{' causal' if causal else ''} b{b} h{h} s{s} d{d}"
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        vendor = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)) / 1e3
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        print(f"{name}: SDPA {vendor * 1e6:.1f} us {flops / vendor / 1e12:.0f} TFLOP/s", flush=True)
        rows.append({"case": name, "vendor_us": vendor * 1e6, "vendor_tflops": flops / vendor / 1e12})
        for block_m, block_n, stages, ws in itertools.product((64, 128), (64, 128), (2, 3, 4), (False, True)):
            if block_m > s or (causal and block_n > block_m):
                continue
            out = torch.empty_like(q)
            grid = (triton.cdiv(s, block_m), b * h)
            args = (q, k, v, out, h, s, *q.stride()[:3], 1 / math.sqrt(d) * 1.4426950408889634)
            meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, D=d, CAUSAL=causal, WS=ws, num_warps=4, num_stages=stages)
            config = {key: meta[key] for key in ("BLOCK_M", "BLOCK_N", "WS", "num_stages")}
            try:
                _attention[grid](*args, **meta)
                error = (out.float() - want.float()).abs().max().item()
            except Exception as exc:  # a config the compiler or the card rejects is a row, not a stop
                rows.append({"case": name, "config": config, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            if not error < 2e-2:
                rows.append({"case": name, "config": config, "error": f"max abs error {error}"})
                continue
            seconds = do_bench(lambda: _attention[grid](*args, **meta)) / 1e3
            rows.append(_row(name, flops, seconds, vendor, config))
            print(f"  {config} {seconds * 1e6:.1f} us {flops / seconds / 1e12:.0f} TFLOP/s {vendor / seconds:.2f}x",
                  flush=True)
    return rows


def gemm_rows(sms):
    rows = []
    for m, n, k in ((4096, 768, 768), (4096, 3072, 768), (4096, 768, 3072), (4096, 4096, 4096),
                    (4096, 11008, 4096)):
        name = f"gemm {m}x{n}x{k}"
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        want = a @ b.T
        vendor = do_bench(lambda: a @ b.T) / 1e3
        flops = 2 * m * n * k
        print(f"{name}: cuBLAS {vendor * 1e6:.1f} us {flops / vendor / 1e12:.0f} TFLOP/s", flush=True)
        rows.append({"case": name, "vendor_us": vendor * 1e6, "vendor_tflops": flops / vendor / 1e12})
        for block_m, block_n, stages, ws in itertools.product((128, 256), (64, 128, 256), (3, 4), (False, True)):
            if block_m * block_n > 128 * 256 or (block_m * block_n == 128 * 256 and stages > 3):
                continue
            out = torch.empty(m, n, device="cuda", dtype=torch.float16)
            tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
            grid = (min(tiles, sms),)
            meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64, GROUP_M=8, WS=ws,
                        num_warps=4 if ws else 8, num_stages=stages)
            config = {key: meta[key] for key in ("BLOCK_M", "BLOCK_N", "WS", "num_warps", "num_stages")}
            try:
                _gemm[grid](a, b, out, m, n, k, **meta)
                error = ((out.float() - want.float()).abs().max() / want.float().abs().max()).item()
            except Exception as exc:
                rows.append({"case": name, "config": config, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            if not error < 1e-2:
                rows.append({"case": name, "config": config, "error": f"max rel error {error}"})
                continue
            seconds = do_bench(lambda: _gemm[grid](a, b, out, m, n, k, **meta)) / 1e3
            rows.append(_row(name, flops, seconds, vendor, config))
            print(f"  {config} {seconds * 1e6:.1f} us {flops / seconds / 1e12:.0f} TFLOP/s {vendor / seconds:.2f}x",
                  flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", choices=("attention", "gemm"))
    args = parser.parse_args()
    # device-made descriptors live in a per-launch global scratch that Triton asks the host for
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    if args.only in (None, "attention"):
        rows += attention_rows(sms)
    if args.only in (None, "gemm"):
        rows += gemm_rows(sms)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
