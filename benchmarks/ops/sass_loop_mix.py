"""What attention's key loop costs an SM, read from its sm_90 SASS (no GPU needed).

For the issue's attention shapes, the configuration measured best on the H200 (the
shipped priors) is compiled for sm_90 as a GPU would build it (compile_only), disassembled with
Triton's cuobjdump, and every loop that issues HGMMA (a backward branch closes it) is counted by
instruction class. Per iteration of that loop, with one program per SM (the configurations below
fill the SM's shared memory or registers), the model gives each unit's cycles:

  tensor  sum over HGMMA of M*N*K * warpgroups / dense FMA per clock per SM (fp16/bf16 2048,
          tf32 1024: the H100/H200 SXM datasheet peaks at 1.83 GHz, 132 SMs)
  issue   instructions * warps per SM sub-partition (each issues one instruction a clock)
  mufu    MUFU * warps * 32 lanes / 16 a clock        (CUDA C Programming Guide, cc 9.0 throughputs)
  fp32    FFMA/FMUL/FADD * warps * 32 / 128 a clock
  alu     compares, selects, min/max, logic, int adds, conversions * warps * 32 / 64 a clock

The non-tensor units overlap one another (instruction-level parallelism), so the loop's CUDA-core
time is the largest of issue, mufu, fp32 and alu. Two bounds on the tensor cores' busy share follow:
"serial" when nothing hides that time behind the HGMMAs (tensor + cuda-core cycles), "overlapped"
when all of it is hidden (the larger of the two): what a kernel with no overlap, and one that
overlaps perfectly (FA3's warp specialization and ping-pong), can reach. A model from instruction
counts, not a measurement: latencies, barriers and memory stalls only lower these numbers.

    python benchmarks/ops/sass_loop_mix.py --out benchmarks/results/sass-loop-mix-DATE.json
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import re
import subprocess
import sys
import tempfile
from typing import Any

import triton

from portkern.backends.base import Candidate
from portkern.backends.triton.compile_only import compile_for
from portkern.backends.triton.modules import builtin_variants
from portkern.hwprofile import load_profile
from portkern.priors import load_priors
from portkern.synthetic import attention_task
from portkern.tasks import Task

CASES: dict[str, Task] = {
    "attn b32 h12 s128 d64": attention_task(32, 12, 128, 64, "float16"),
    "attn b8 h12 s512 d64": attention_task(8, 12, 512, 64, "float16"),
    "attn causal b4 h32 s2048 d128": attention_task(4, 32, 2048, 128, "float16", causal=True),
}
TENSOR_FMA_PER_CLOCK = {"f16": 2048, "tf32": 1024}  # dense, per SM
LANES_PER_CLOCK = {"mufu": 16, "fp32": 128, "alu": 64}  # per SM
SUB_PARTITIONS = 4
MAX_THREADS_PER_SM = 2048
FP32_OPS = ("FFMA", "FMUL", "FADD")
ALU_OPS = ("FMNMX", "FSEL", "FSETP", "ISETP", "LOP3", "IADD3", "VIADD", "SHF", "SEL", "PLOP3", "LEA", "F2FP", "IMNMX")
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_HGMMA = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)\.F32(\.TF32)?")


def best_prior(task: Task) -> tuple[str, dict[str, Any], float] | None:
    """(variant, config, seconds) of the fastest shipped H200 prior for exactly this task."""
    found = [p for p in load_priors("h200") if p.task == task.describe()]
    if not found:
        return None
    best = min(found, key=lambda p: p.seconds)
    return best.variant, best.config, best.seconds


def sass(cubin: bytes) -> list[tuple[int, str, bool]]:
    """(address, instruction without its predicate, whether it had one) of every instruction."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "-sass", handle.name], capture_output=True,
                              text=True, check=True).stdout
    found = []
    for match in _LINE.finditer(text):
        instruction = re.sub(r"^@!?U?P\w+\s+", "", match.group(2))
        found.append((int(match.group(1), 16), instruction, instruction != match.group(2)))
    return found


def hgmma_loops(instructions: list[tuple[int, str, bool]]) -> list[list[str]]:
    """Bodies of the innermost loops that issue HGMMA. A loop is closed by a predicated backward
    branch; an unpredicated one is the jump back from an out-of-line barrier-wait retry."""
    spans = []
    for address, text, predicated in instructions:
        branch = re.match(r"BRA (0x[0-9a-f]+)", text)
        if predicated and branch and int(branch.group(1), 16) < address:
            spans.append((int(branch.group(1), 16), address))
    innermost = [(lo, hi) for lo, hi in spans
                 if not any((lo, hi) != (a, b) and lo <= a and b <= hi for a, b in spans)]
    bodies = [[t for a, t, _ in instructions if lo <= a <= hi] for lo, hi in innermost]
    return [body for body in bodies if any(t.startswith("HGMMA") for t in body)]


def hot_loop_ops(cubin: bytes, opcodes: tuple[str, ...]) -> list[int]:
    """Instructions of these opcodes in each innermost loop that issues HGMMA, in code order."""
    return [sum(op.startswith(opcodes) for op in body) for body in hgmma_loops(sass(cubin))]


def hot_loop_spill_ops(cubin: bytes) -> list[int]:
    """Spill loads and stores (STL/LDL) in each innermost loop that issues HGMMA: a spill there is
    paid every step, one outside (an epilogue) once."""
    return hot_loop_ops(cubin, ("STL", "LDL"))


def programs_per_sm(kernel: dict[str, Any], limits: dict[str, float]) -> int:
    """Programs one SM holds at once, by shared memory, registers and threads."""
    threads = kernel["num_warps"] * 32
    by_shared = int(limits["shared_mem_per_sm"]) // max(kernel["shared"], 1)
    by_registers = int(limits["registers_per_sm"]) // (kernel["n_regs"] * threads)
    return max(1, min(by_shared, by_registers, MAX_THREADS_PER_SM // threads))


def loop_model(body: list[str], num_warps: int, programs: int) -> dict[str, Any]:
    """One iteration's cycles on each unit for one program, and the bound on the tensor cores' busy
    share: `programs` resident programs each run tensor then CUDA-core work in turn (the scores feed
    the softmax, which feeds the second product), so a round of one iteration each takes at least
    the longest of programs x tensor, programs x CUDA-core, and one program's tensor + CUDA-core."""
    opcodes = collections.Counter(text.split()[0] for text in body)
    warpgroups = num_warps / 4
    tensor = 0.0
    for text in body:
        match = _HGMMA.match(text)
        if match:
            m, n, k = (int(match.group(i)) for i in (1, 2, 3))
            tensor += m * n * k * warpgroups / TENSOR_FMA_PER_CLOCK["tf32" if match.group(4) else "f16"]
    lanes = num_warps * 32

    def count(prefixes: tuple[str, ...]) -> int:
        return sum(c for op, c in opcodes.items() if op.split(".")[0] in prefixes)

    units = {"issue": len(body) * num_warps / SUB_PARTITIONS,
             "mufu": count(("MUFU",)) * lanes / LANES_PER_CLOCK["mufu"],
             "fp32": count(FP32_OPS) * lanes / LANES_PER_CLOCK["fp32"],
             "alu": count(ALU_OPS) * lanes / LANES_PER_CLOCK["alu"]}
    cuda_cores = max(units.values())
    round_cycles = max(programs * tensor, programs * cuda_cores, tensor + cuda_cores)
    return {"instructions": len(body), "opcodes": dict(opcodes.most_common()), "tensor_cycles": tensor,
            **{f"{unit}_cycles": cycles for unit, cycles in units.items()},
            "bound_by": max(units, key=units.__getitem__),
            "tensor_share_bound": programs * tensor / round_cycles,
            "tensor_share_if_overlapped": tensor / max(tensor, cuda_cores)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    variants = {v.name: v for v in builtin_variants()}
    limits = load_profile("h200").limits
    rows = []
    for name, task in CASES.items():
        prior = best_prior(task)
        if prior is None:
            print(f"{name}: no H200 prior for this task", flush=True)
            continue
        variant_name, config, seconds = prior
        variant = variants[variant_name]
        report = compile_for(Candidate.of(variant, {**variant.default, **config}), task, "sm_90")
        kernel = report["kernels"][0]
        programs = programs_per_sm(kernel, limits)
        loops = [loop_model(body, kernel["num_warps"], programs) for body in hgmma_loops(sass(kernel["asm"]["cubin"]))]
        rows.append({"case": name, "task": task.describe(), "variant": variant_name, "config": config,
                     "prior_seconds_h200": seconds, "registers": kernel["n_regs"], "shared": kernel["shared"],
                     "num_warps": kernel["num_warps"], "programs_per_sm": programs, "loops": loops})
        print(f"{name}: {variant_name} {config} ({seconds * 1e6:.1f} us on the H200), {kernel['n_regs']} registers, "
              f"{kernel['shared']} B shared: {programs} program(s) per SM", flush=True)
        for loop in loops:
            print(f"  loop of {loop['instructions']} instructions: tensor {loop['tensor_cycles']:.0f} cycles, "
                  f"issue {loop['issue_cycles']:.0f}, mufu {loop['mufu_cycles']:.0f}, fp32 {loop['fp32_cycles']:.0f}, "
                  f"alu {loop['alu_cycles']:.0f} ({loop['bound_by']}-bound): tensor cores busy at most "
                  f"{loop['tensor_share_bound']:.0%} ({loop['tensor_share_if_overlapped']:.0%} if all CUDA-core work "
                  "hid behind HGMMA)",
                  flush=True)
    record = {"what": "static model of each kernel's HGMMA loops from its sm_90 SASS (not a measurement)",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "command": " ".join(sys.argv),
              "triton": triton.__version__, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
