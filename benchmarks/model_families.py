"""Model-level wins, audited end to end: every sample family through the optimizer, then the
whole forward pass (prefill, and decode where the model keeps a cache) audited against eager
transformers, for Dyno's artifact and for whole-model `torch.compile` with default settings.

Run:  .venv/bin/python benchmarks/model_families.py [--families llama,bert] [--shapes 2x64,8x64]
Writes benchmarks/results/model-families-<profile>.json and prints a table. Samples are the
project's own (runners/samples.py, random weights) plus "bert-minilm", a sentence-embedding-sized
BERT encoder (hidden 384, 6 layers, 12 heads), also with random weights.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402

from optimizer.model import Strategy, optimize_model  # noqa: E402
from runners import measure  # noqa: E402
from runners.fingerprint import environment_fingerprint  # noqa: E402
from runners.modelaudit import audit_model_forward  # noqa: E402
from runners.samples import SAMPLE_FAMILIES, write_sample_model  # noqa: E402

DEFAULT_FAMILIES = ("llama", "qwen2", "mixtral", "gpt2", "bert", "bert-minilm", "mamba", "t5")


def _write_family(dest: Path, family: str) -> Path:
    if family == "bert-minilm":
        torch.manual_seed(0)
        config = transformers.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                         intermediate_size=1536, vocab_size=30522, architectures=["BertModel"])
        transformers.BertModel(config).eval().save_pretrained(dest, safe_serialization=True)
        return dest
    return write_sample_model(dest, family)


def _phases(block: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for phase in block["phases"]:
        out[phase["phase"]] = {
            "verdict": phase["verdict"],
            "speedup": phase.get("speedup"),
            "ci95": phase.get("ci95"),
            "aa_stable": (phase.get("aa") or {}).get("stable"),
            "aa": (phase.get("aa") or {}).get("speedup"),
            "aa_ci95": (phase.get("aa") or {}).get("ci95"),
            "billable": phase.get("billable"),
            "reasons": [r["code"] for r in phase.get("reasons", [])],
            "messages": [r["message"][:300] for r in phase.get("reasons", [])],
            "note": phase.get("note"),
            "billed_from_call": phase.get("billed_from_call"),
            "unbilled_call_per_billed_call": phase.get("unbilled_call_per_billed_call") or None,
            "unbilled_call_excess": phase.get("unbilled_call_excess"),
            # What the optimized worker's CPU outside its windows and what it left behind read
            # (runners.modelaudit: background_cpu, left_behind), against which the verdict was judged.
            "background_cpu": phase.get("background_cpu") or None,
            "left_behind": phase.get("left_behind") or None,
            # Decode's prompt window as judged (runners.modelaudit._judge_prompt), and whether every
            # sample was held between its calls.
            "prompt": phase.get("prompt") or None,
            "held_between_calls": phase.get("held_between_calls"),
        }
    return out


def _reference(block: dict[str, Any], name: str) -> dict[str, Any]:
    out = {}
    for phase in block["phases"]:
        ref = (phase.get("reference_points") or {}).get(name)
        if ref:
            out[phase["phase"]] = {"verdict": "measured", "speedup": ref["speedup_over_eager"], "ci95": ref["ci95"],
                                   "aa_stable": (phase.get("aa") or {}).get("stable"), "billable": False,
                                   "artifact_over_reference": ref["artifact_over_reference"],
                                   "artifact_over_reference_ci95": ref["artifact_over_reference_ci95"]}
    return out


def run_one(folder: Path, *, batch: int, seq: int, profile: str) -> dict[str, Any]:
    started = time.monotonic()
    artifact = optimize_model(folder, batch=batch, seq=seq, device="cpu",
                              threads=measure.protocol_for(profile).worker_threads())
    optimize_s = time.monotonic() - started
    row: dict[str, Any] = {
        "strategy": artifact.strategy,
        "compile_variant": (artifact.verification.get(Strategy.COMPILE) or {}).get("variant"),
        "estimates_s": artifact.estimates,
        "optimized_modules": sum(1 for m in artifact.modules if m.status == "optimized"),
        "optimize_s": optimize_s,
    }
    seed = secrets.randbits(31)
    # One audit: the artifact and the free reference (the forward under torch.compile, default
    # settings) measured against eager in the same rounds, so "over torch.compile" is a paired figure.
    dyno = audit_model_forward(folder, artifact, batch=batch, seq=seq, device="cpu", profile=profile, seed=seed,
                               reference_points=("torch-compile",))
    row["dyno"] = _phases(dyno)
    row["torch_compile"] = _reference(dyno, "torch-compile")
    row["notes"] = dyno.get("notes", [])
    row["wall_s"] = time.monotonic() - started
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES))
    parser.add_argument("--shapes", default="2x64", help="comma-separated BATCHxSEQ")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in SAMPLE_FAMILIES and f != "bert-minilm"]
    if unknown:
        parser.error(f"unknown families {unknown}; use {sorted(SAMPLE_FAMILIES) + ['bert-minilm']}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]
    out = args.out or ROOT / "benchmarks" / "results" / f"model-families-{args.profile}.json"
    report: dict[str, Any] = {
        "benchmark": "model_families",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/model_families.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "profile": args.profile,
        "environment": environment_fingerprint(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "rows": [],
    }
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            folder = _write_family(Path(tmp) / family, family)
            for batch, seq in shapes:
                row = {"family": family, "batch": batch, "seq": seq, **run_one(folder, batch=batch, seq=seq, profile=args.profile)}
                report["rows"].append(row)
                for side in ("dyno", "torch_compile"):
                    for phase, figure in row[side].items():
                        ci = figure["ci95"]
                        shown = f"{figure['speedup']:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else figure["verdict"]
                        print(f"{family:12s} {batch}x{seq:<4d} {side:13s} {phase:7s} {shown}"
                              f"{'' if figure['aa_stable'] in (None, True) else '  A/A unstable'}"
                              f"{'  billable' if figure['billable'] else ''}", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                report["wall_s"] = time.monotonic() - started
                out.write_text(json.dumps(report, indent=1, default=str) + "\n")  # as it goes
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {out} in {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
