"""The per-process bias of memory-bound CPU kernels, outside the audit harness.

An A/A audit compares two processes running the same baseline; on the development VM the two
differ by several per cent with tight intervals (the measurement issue). This experiment asks
whether plain PyTorch shows it without any of the harness (no sandbox, no cgroup, no stepping):
P processes load the same inputs from one shared file, are pinned to the same core, and take turns
in a random order each round; each turn times 5 calls of the workload after one untimed call. Per
process: the median over rounds; across processes: the spread of those medians and whether a
process's place is stable (the correlation of its first-half and second-half medians: near 1 means
a persistent per-process bias, near 0 means round-to-round noise).

Variants (every process of a run gets the same one):
  plain          the suite's baseline as written (a fresh output and temporaries every call), the
                 harness's glibc thresholds
  manual         rmsnorm only: the formula written out (pow, mean, rsqrt, two products), a fresh
                 output and temporaries every call, where the suite's baseline is one fused op
  reuse          rmsnorm only: the written-out formula into two buffers allocated once (out=)
  thp            glibc's heap on transparent huge pages (glibc.malloc.hugetlb=1)
  deterministic  address randomization off (setarch -R) and a fixed Python hash seed
  arenas         each turn's calls run in one of 8 threads drawn at random (a glibc arena each)
  one-thread     every turn's calls in the same one thread (an arena of its own, not the main heap)
  refault        before each turn the free heap goes back to the kernel (malloc_trim) and 48 MiB
                 are faulted in again outside the timed calls, so each turn's pages are new

    python benchmarks/process_bias.py [--processes 8] [--rounds 30] [--repeats 2] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners import suite  # noqa: E402
from runners.sandbox import MALLOC_ENVIRONMENT  # noqa: E402

WORKER = r'''
import ctypes, os, secrets, sys, time, json, statistics
import torch
sys.path.insert(0, sys.argv[3])
from runners import suite
os.sched_setaffinity(0, {int(sys.argv[4])})
torch.set_num_threads(1)
spec = [s for s in suite.profile_specs("cpu") if s.name == sys.argv[1]][0]
inputs = tuple(torch.from_file(p, shared=True, size=n, dtype=torch.float32).view(*shape)
               for p, n, shape in json.loads(sys.argv[2]))
fn = suite.baseline_fn(spec)
variant = os.environ["BIAS_VARIANT"]
if variant == "manual":
    def fn(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
if variant == "reuse":
    x, w = inputs
    scratch, out = torch.empty_like(x), torch.empty_like(x)
    scratch.fill_(0); out.fill_(0)
    def fn(x, w):
        torch.pow(x, 2, out=scratch)
        r = torch.rsqrt(scratch.mean(-1, keepdim=True) + 1e-6)
        torch.mul(x, r, out=scratch)
        return torch.mul(scratch, w, out=out)
libc = ctypes.CDLL(None)
held = None

def turn():
    """One untimed call, then the median of 5 timed ones; the last result stays alive."""
    result = fn(*inputs)
    times = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        result = fn(*inputs)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times), result

if variant in ("arenas", "one-thread"):
    # Each turn's calls run in one of several threads, drawn at random: glibc gives each thread an
    # arena of its own, so a turn's fresh tensors come from one of several heaps.
    import queue, random, threading
    lanes = []
    def lane(inbox, outbox):
        torch.set_num_threads(1)
        with torch.no_grad():
            while True:
                inbox.get()
                outbox.put(turn())
    for _ in range(8 if variant == "arenas" else 1):
        inbox, outbox = queue.Queue(), queue.Queue()
        threading.Thread(target=lane, args=(inbox, outbox), daemon=True).start()
        lanes.append((inbox, outbox))
    for _ in sys.stdin:
        held = None
        inbox, outbox = random.choice(lanes)
        inbox.put(None)
        median, held = outbox.get()
        print(median, flush=True)
    sys.exit(0)
with torch.no_grad():
    for _ in sys.stdin:
        held = None
        if variant == "refault":
            libc.malloc_trim(0)
            blocks = [torch.empty(16 << 20, dtype=torch.uint8) for _ in range(3)]
            for b in blocks:
                b.fill_(0)
            del blocks
        spacer = torch.empty(64 * secrets.randbelow(65), dtype=torch.uint8)
        median, result = turn()
        held = (spacer, result)
        print(median, flush=True)
'''

VARIANTS = ("plain", "manual", "reuse", "thp", "deterministic", "refault", "arenas", "one-thread")


def run_once(workload: str, variant: str, processes: int, rounds: int, workdir: Path, core: int) -> dict:
    spec = next(s for s in suite.profile_specs("cpu") if s.name == workload)
    metas = []
    for index, tensor in enumerate(suite.make_inputs(spec, seed=1)):
        if tensor is None:
            continue
        path = workdir / f"{workload}-{index}.bin"
        tensor.contiguous().float().numpy().tofile(path)
        metas.append((str(path), tensor.numel(), list(tensor.shape)))
    script = workdir / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, **MALLOC_ENVIRONMENT, "BIAS_VARIANT": variant}
    prefix: list[str] = []
    if variant == "thp":
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    if variant == "deterministic":
        env["PYTHONHASHSEED"] = "0"
        prefix = ["setarch", "-R"]
    argv = prefix + [sys.executable, str(script), workload, json.dumps(metas), str(ROOT), str(core)]
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(processes)]
    times: list[list[float]] = [[] for _ in procs]
    try:
        for _ in range(rounds):
            order = list(range(processes))
            random.shuffle(order)
            for k in order:
                procs[k].stdin.write("go\n")
                procs[k].stdin.flush()
                times[k].append(float(procs[k].stdout.readline()))
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()
    settled = [t[2:] for t in times]  # two turns of warm-up
    medians = np.array([np.median(t) for t in settled])
    rel = medians / np.median(medians)
    half = len(settled[0]) // 2
    first, second = [np.median(t[:half]) for t in settled], [np.median(t[half:]) for t in settled]
    return {
        "workload": workload,
        "variant": variant,
        "processes": processes,
        "rounds": rounds,
        "median_us": round(float(np.median(medians)) / 1e3, 1),
        "relative": [round(float(r), 3) for r in rel],
        "spread": round(float(rel.max() - rel.min()), 3),
        "between_process_sd": round(float(np.std(np.log(medians), ddof=1)), 4),
        "split_half_correlation": round(float(np.corrcoef(first, second)[0, 1]), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--core", type=int, default=os.cpu_count() - 1)
    parser.add_argument("--only", help="comma-separated workload:variant pairs instead of the whole plan")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "process-bias-cpu.json"))
    args = parser.parse_args()
    plan = [("rmsnorm", v) for v in VARIANTS] + [(w, "plain") for w in ("softmax", "swiglu", "rope")]
    if args.only:
        plan = [tuple(item.split(":")) for item in args.only.split(",")]
    rows = []
    started = time.time()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        for repeat in range(args.repeats):
            for workload, variant in plan:
                row = run_once(workload, variant, args.processes, args.rounds, Path(tmp), args.core)
                row["repeat"] = repeat
                row["load"] = round(os.getloadavg()[0], 2)
                rows.append(row)
                print(f"{workload:9s} {variant:13s} {row['median_us']:8.0f} us  spread {row['spread']:.3f}  "
                      f"sd {row['between_process_sd']:.3f}  split-half r {row['split_half_correlation']:+.2f}", flush=True)
    document = {
        "experiment": "per-process bias of the suite's CPU baselines outside the harness (benchmarks/process_bias.py)",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "command": " ".join(["python", "benchmarks/process_bias.py", *sys.argv[1:]]),
        "wall_s": round(time.time() - started),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
