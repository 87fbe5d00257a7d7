"""How fast can one launch read a weight at all? The ceiling a skinny GEMM is judged against.

A decode-size GEMM reads its weight once; its time cannot be below that of the best pure read of
the same bytes in the same harness (portkern's time_once: device events behind a spin kernel). This
probe times, for each weight size of the skinny-GEMM suite, with rotating buffers larger than L2:
  - an empty launch (the harness's fixed cost: event resolution, launch gap),
  - a Triton streaming read (each program sums its slice; tile and program count swept, best kept),
  - torch's device-to-device copy (reads + writes, counted both ways, as the 4.2 TB/s figure is).
The best read, as TB/s of the weight, is the practical ceiling for that size.

    bash benchmarks/gpu_run.sh python3 benchmarks/ops/read_ceiling_probe.py --out $OUT/read-ceiling.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from portkern.backends import get_backend
from portkern.hwprofile import load_target

WEIGHTS = {"4096x4096": 4096 * 4096, "11008x4096": 11008 * 4096}  # fp16 elements
ROTATION = 4  # buffers per size, so that every read comes from HBM (H200 L2: 60 MB)


@triton.jit
def _stream_read(x_ptr, partial_ptr, n, per_program, BLOCK: tl.constexpr):
    start = tl.program_id(0) * per_program
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for offset in range(start, start + per_program, BLOCK):
        idx = offset + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    tl.store(partial_ptr + tl.program_id(0), tl.sum(acc))


def median_time(backend, run, repeats: int = 30) -> float:
    for _ in range(3):
        run(0)
    return statistics.median(backend.time_once(lambda i=i: run(i % ROTATION)) for i in range(repeats))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="read_ceiling.json")
    args = parser.parse_args()
    backend = get_backend(load_target("h200"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiny = torch.zeros(1, device="cuda")
    empty = median_time(backend, lambda i: tiny.add_(0))
    rows = []
    for name, elements in WEIGHTS.items():
        buffers = [torch.randn(elements, device="cuda", dtype=torch.float16) for _ in range(ROTATION)]
        copies = [torch.empty_like(b) for b in buffers]
        nbytes = elements * 2
        reads = []
        for programs_per_sm in (1, 2, 4, 8):
            programs = programs_per_sm * sms
            partial = torch.empty(programs, device="cuda", dtype=torch.float32)
            for block in (1024, 2048, 4096, 8192):
                per_program = triton.cdiv(triton.cdiv(elements, programs), block) * block
                for warps in (4, 8):
                    def read(i, p=programs, pp=per_program, b=block, w=warps, out=partial):
                        _stream_read[(p,)](buffers[i], out, elements, pp, BLOCK=b, num_warps=w)
                    seconds = median_time(backend, read)
                    reads.append({"programs": programs, "block": block, "num_warps": warps, "seconds": seconds})
        best = min(reads, key=lambda r: r["seconds"])
        copy = median_time(backend, lambda i: copies[i].copy_(buffers[i]))
        rows.append({"weight": name, "bytes": nbytes, "empty_launch_seconds": empty, "best_read": best,
                     "read_tbps": nbytes / best["seconds"] / 1e12, "copy_seconds": copy,
                     "copy_tbps_read_plus_write": 2 * nbytes / copy / 1e12, "reads": reads})
        print(f"{name}: {nbytes / 1e6:.1f} MB  empty launch {empty * 1e6:.1f} us  best read "
              f"{best['seconds'] * 1e6:.1f} us = {rows[-1]['read_tbps']:.2f} TB/s ({best['programs']} programs, "
              f"BLOCK {best['block']}, {best['num_warps']} warps)  copy {copy * 1e6:.1f} us = "
              f"{rows[-1]['copy_tbps_read_plus_write']:.2f} TB/s read+write", flush=True)
    document = {"benchmark": "read ceiling of one launch per weight size", "device": backend.fingerprint(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": " ".join(sys.argv), "method": backend.timing_method, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(document, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
