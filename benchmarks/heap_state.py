"""Whether a process's speed on a memory-bound baseline follows its heap's state, outside the harness.

Processes run the suite's baseline of one `cpu` workload in the harness's regime (every call in one
thread of its own, as `runners.audit.worker.CallLane` runs them; eight calls a turn over four input
slots of one shared file; a turn's outputs held until the next turn starts) and take turns in a
random order, round after round, on one pinned core. Each process is given a heap-spacer policy:
before each turn it allocates and holds a block of `none` (no block), `random` (0 to 4 KiB in
steps of 64 bytes, drawn per turn: what audit workers did until 2026-12-06) or a fixed number of
bytes. With `--kids K` each process, once warm, forks K children that take turns as well: a child
starts from its parent's heap with its own physical pages for whatever it writes (copy on write),
so children that repeat the same allocations show what the heap's state alone does.

Per process: the median of its turns' median call. Reported: the processes' medians by policy,
their spread (between-process SD relative to the median of all), and whether a process keeps its
place (the correlation of its medians over odd and even rounds: near 1, a per-process effect;
near 0, noise).

    python benchmarks/heap_state.py --policies none,none,none,none,random,random,random,random
    python benchmarks/heap_state.py --policies none,none,none,none --kids 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
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

CALLS, SLOTS, WARM_TURNS = 8, 4, 5


def _serve(workload: str, policy: str, kids: int, core: int, inputs_json: str) -> None:
    """A process of the experiment: answers `-1` (a turn of its own) or `k` (a turn of child k)."""
    import queue
    import secrets
    import threading

    import torch

    os.sched_setaffinity(0, {core})
    spec = next(s for s in suite.profile_specs("cpu") if s.name == workload)
    fn = suite.baseline_fn(spec)
    slots = [tuple(torch.from_file(path, shared=True, size=n, dtype=torch.float32).view(*shape)
                   for path, n, shape in slot) for slot in json.loads(inputs_json)]
    held: list = [None]

    def turn() -> float:
        held[0] = None
        size = {"none": 0, "random": 64 * secrets.randbelow(65)}.get(policy)
        spacer = torch.empty(int(policy) if size is None else size, dtype=torch.uint8)
        outputs, times = [], []
        with torch.no_grad():
            for call in range(CALLS):
                started = time.perf_counter_ns()
                outputs.append(fn(*slots[call % SLOTS]))
                times.append(time.perf_counter_ns() - started)
        held[0] = (spacer, outputs)
        return statistics.median(times)

    inbox: queue.SimpleQueue = queue.SimpleQueue()
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def lane() -> None:
        torch.set_num_threads(1)
        while True:
            inbox.get()
            outbox.put(turn())

    def lane_turn() -> float:
        inbox.put(None)
        return outbox.get()

    threading.Thread(target=lane, daemon=True).start()
    for _ in range(WARM_TURNS):
        lane_turn()
    children = []
    for _ in range(kids):
        command_r, command_w = os.pipe()
        answer_r, answer_w = os.pipe()
        if os.fork() == 0:  # the child: only this thread survives the fork; a new lane takes the arena
            os.close(command_w)
            os.close(answer_r)
            threading.Thread(target=lane, daemon=True).start()
            for _ in range(2):
                lane_turn()
            while os.read(command_r, 1):
                os.write(answer_w, f"{lane_turn()}\n".encode())
            os._exit(0)
        os.close(command_r)
        os.close(answer_w)
        children.append((command_w, answer_r))
    for line in sys.stdin:
        k = int(line)
        if k < 0:
            print(lane_turn(), flush=True)
            continue
        os.write(children[k][0], b"g")
        answer = b""
        while not answer.endswith(b"\n"):
            answer += os.read(children[k][1], 64)
        print(float(answer), flush=True)


def run(workload: str, policies: list[str], kids: int, rounds: int, core: int, workdir: Path) -> dict:
    spec = next(s for s in suite.profile_specs("cpu") if s.name == workload)
    slots = []
    for seed in range(SLOTS):
        slot = []
        for index, tensor in enumerate(suite.make_inputs(spec, seed=seed)):
            if tensor is None:
                continue
            path = workdir / f"{workload}-{seed}-{index}.bin"
            tensor.contiguous().float().numpy().tofile(path)
            slot.append((str(path), tensor.numel(), list(tensor.shape)))
        slots.append(slot)
    env = {**os.environ, **MALLOC_ENVIRONMENT}
    heads = [subprocess.Popen([sys.executable, __file__, "--serve", workload, policy, str(kids), str(core), json.dumps(slots)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for policy in policies]
    members = [(h, k) for h in range(len(heads)) for k in range(-1, kids)]
    turns: dict = {m: [] for m in members}
    for _ in range(rounds):
        random.shuffle(members)
        for h, k in members:
            heads[h].stdin.write(f"{k}\n")
            heads[h].stdin.flush()
            turns[(h, k)].append(float(heads[h].stdout.readline()))
    for head in heads:
        head.stdin.close()
        head.wait()
    members.sort()
    medians = {m: statistics.median(turns[m]) for m in members}
    overall = statistics.median(medians.values())
    odd = [statistics.median(turns[m][0::2]) for m in members]
    even = [statistics.median(turns[m][1::2]) for m in members]
    families = [[round(medians[(h, k)] / overall, 3) for k in range(-1, kids)] for h in range(len(heads))]
    row = {"workload": workload, "policies": policies, "kids": kids, "rounds": rounds,
           "median_us": round(overall / 1000, 1),
           "relative_by_process": families,
           "between_process_sd": round(float(np.std([medians[m] / overall for m in members])), 4),
           "split_half_correlation": round(float(np.corrcoef(odd, even)[0, 1]), 2)}
    if kids:
        row["within_family_sd"] = round(statistics.mean(float(np.std(f)) for f in families), 4)
        row["between_family_sd"] = round(float(np.std([np.mean(f) for f in families])), 4)
    by_policy: dict = {}
    for (h, k), value in medians.items():
        by_policy.setdefault(policies[h], []).append(round(value / 1000, 1))
    row["median_us_by_policy"] = by_policy
    return row


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="rmsnorm")
    parser.add_argument("--policies", default="none,none,none,none,random,random,random,random",
                        help="one heap-spacer policy per process: none, random or a number of bytes")
    parser.add_argument("--kids", type=int, default=0, help="children forked by each process once warm")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--core", type=int, default=None, help="the core every process is pinned to")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    core = args.core if args.core is not None else allowed[-1]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for policy in policies:
        if policy not in ("none", "random") and not policy.isdigit():
            parser.error(f"policy {policy!r}: none, random or a number of bytes")
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            row = run(args.workload, policies, args.kids, args.rounds, core, Path(tmp))
            row["repeat"] = repeat
            row["load"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    document = {"experiment": "heap_state", "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
                "machine": f"{platform.machine()}, {len(allowed)} CPUs", "command": " ".join(sys.argv),
                "wall_s": round(time.perf_counter() - started, 1), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
