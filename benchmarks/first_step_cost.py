"""What a table of decode's first token could spare: a two-token step against a one-token step.

Decode's first timed call over a key/value cache carries two new tokens per batch entry
(runners.audit.model_worker._FIRST_STEP_TOKENS). The first of them sits on the prompt's cache
alone, so a worker could tabulate its outputs for every token of the vocabulary while preparing
and then compute only the second token's position: the most that saves is the difference between
a two-token step and a one-token step over the same cache. This times both, in this process, with
the trusted worker's own steps (runners.audit.model_worker.ModelRunner), eager, for each decoder
sample family, and reports that difference in units of one billed call.

    python benchmarks/first_step_cost.py [--families llama,gpt2,...] [--batch 2] [--seq 64] [--repeats 200] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DYNO_ENV", "development")

import torch  # noqa: E402

from runners.audit.model_worker import ModelRunner  # noqa: E402
from runners.samples import write_sample_model  # noqa: E402

DECODERS = ("llama", "mistral", "qwen2", "mixtral", "gpt2", "t5")


def step_times(folder: Path, *, batch: int, seq: int, repeats: int, tokens: int) -> list[float]:
    """Seconds of a decode step of `tokens` new tokens per batch entry over the prompt's cache, each
    on a freshly prepared cache (so every step sees a cache of `seq` tokens)."""
    runner = ModelRunner("cpu")
    runner.op_load({"model_dir": str(folder)}, [])
    vocab = int(runner.config.get_text_config().vocab_size)
    times = []
    generator = torch.Generator().manual_seed(0)
    for repeat in range(repeats):
        runner.op_prepare({"phase": "decode", "seed": repeat, "calls": 2, "vocab": vocab, "batch": batch, "seq": seq,
                           "commit_seed": 1}, [])
        # Call 0 is the prompt (prefilled, untimed here); call 1 the step timed.
        prompt = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randint(0, vocab, (batch * seq,), generator=generator)])
        runner.op_step({"call": 0}, [prompt])
        item = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randint(0, vocab, (batch * tokens,), generator=generator)])
        started = time.perf_counter_ns()
        runner.op_step({"call": 1}, [item])
        times.append((time.perf_counter_ns() - started) / 1e9)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(DECODERS))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "first-step-cost-cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for family in args.families.split(","):
            folder = write_sample_model(Path(scratch) / family, family)
            step_times(folder, batch=args.batch, seq=args.seq, repeats=10, tokens=1)  # warm up
            # Interleaved halves, so a drift of the box lands on both.
            one, two = [], []
            for _ in range(2):
                one += step_times(folder, batch=args.batch, seq=args.seq, repeats=args.repeats // 2, tokens=1)
                two += step_times(folder, batch=args.batch, seq=args.seq, repeats=args.repeats // 2, tokens=2)
            m1, m2 = statistics.median(one), statistics.median(two)
            rows.append({"family": family, "one_token_step_s": m1, "two_token_step_s": m2,
                         "second_token_share_of_a_call": (m2 - m1) / m1})
            print(f"{family:8s} one token {m1 * 1e3:.3f} ms, two tokens {m2 * 1e3:.3f} ms: "
                  f"a first-token table spares at most {(m2 - m1) / m1:.2f} of one call", flush=True)
    document = {
        "benchmark": "first_step_cost",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch": torch.__version__},
        "command": "python benchmarks/first_step_cost.py " + " ".join(sys.argv[1:]),
        "shape": {"batch": args.batch, "cache_tokens": args.seq},
        "families": rows,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
