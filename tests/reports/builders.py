"""Builders for the reports tests: realistic synthetic `dyno.suite-result/1` results and sign-in."""

from __future__ import annotations

import hashlib
import random
import re
import zlib
from datetime import datetime, timezone as dt_timezone
from typing import Any

FINISHED_AT = datetime(2026, 11, 20, 12, 30, tzinfo=dt_timezone.utc)
PASSWORD = "correct-horse-battery"


def _samples(rng: random.Random, median: float, n: int = 24) -> list[float]:
    return sorted(round(median * rng.uniform(0.97, 1.06), 12) for _ in range(n))


def synthetic_result(*, stable: bool = True, model: tuple[float, float, float] | None = (1.31, 1.22, 1.40),
                     seed: int = 7, speedups: dict[str, float] | None = None,
                     environment: dict[str, Any] | None = None, verdict: str | None = None) -> dict[str, Any]:
    """A `dyno.suite-result/1` as `python -m runners suite` writes it, plus the platform's model block."""
    rng = random.Random(seed)
    speedups = speedups or {"rmsnorm": 1.62, "gemm": 1.04, "attention_prefill": 0.98}
    shapes = {"rmsnorm": {"R": 64, "H": 256}, "gemm": {"M": 64, "K": 256, "N": 256},
              "attention_prefill": {"B": 1, "Hq": 4, "Hkv": 2, "S": 32, "D": 16}}
    families = {"rmsnorm": "norm", "gemm": "gemm", "attention_prefill": "attention"}
    workloads = []
    for name, speedup in speedups.items():
        base = {"rmsnorm": 41e-6, "gemm": 180e-6, "attention_prefill": 95e-6}.get(name, 50e-6)
        opt = base / speedup
        accepted = speedup > 1.0
        workloads.append({
            "name": name, "family": families.get(name, "other"), "shape": shapes.get(name, {"N": 8}),
            "dtype": "float32",
            "baseline": {"impl": "eager", "median_s": base, "samples_s": _samples(rng, base)},
            "candidate": {"impl": f"triton-{name}", "source_sha256": hashlib.sha256(name.encode()).hexdigest(),
                          "median_s": opt, "samples_s": _samples(rng, opt)},
            "speedup": speedup, "ci95": [round(speedup * 0.95, 6), round(speedup * 1.04, 6)],
            "correctness": {"passed": True, "max_abs_err": 2.4e-7, "max_rel_err": 1.1e-6, "atol": 1e-5,
                            "rtol": 1e-5, "checks": 12},
            "verdict": "accepted" if accepted else "rejected",
            "reasons": [] if accepted else [{"code": "no_speedup", "message": "the CI includes 1.0"}],
            "reference_points": {"torch-compile": {"median_s": base / 1.2, "speedup_vs_baseline": 1.2}},
        })
    result: dict[str, Any] = {
        "schema": "dyno.suite-result/1",
        "suite": {"version": "1.0.0", "profile": "cpu-ci", "manifest_sha256": "ab" * 32},
        "environment": environment or {"device": "cpu", "cpu": "AMD EPYC 9454 (2 cores)", "torch": "2.13.0",
                                       "triton": "3.5.0", "python": "3.11.9", "os": "Linux 6.1"},
        "protocol": {"rounds": 24, "warmup": 3, "interleaved": True, "bootstrap": 2000, "seed": 1234},
        "calibration": {"aa_speedup": 1.002 if stable else 1.09, "aa_ci95": [0.995, 1.009] if stable else [1.04, 1.15],
                        "stable": stable},
        "workloads": workloads,
        "summary": {"geomean_speedup": 1.18, "accepted": sum(w["verdict"] == "accepted" for w in workloads),
                    "rejected": sum(w["verdict"] == "rejected" for w in workloads), "errors": 0},
    }
    if model is not None:
        result["model"] = {"speedup": model[0], "ci95": [model[1], model[2]], "weighting": "eager-time"}
    if verdict is not None:
        result["verdict"] = verdict
    return result


def signed_in(client, email: str):
    assert client.login(username=email, password=PASSWORD), f"could not sign in as {email}"
    return client


def pdf_text(pdf: bytes) -> bytes:
    """Every stream of a PDF, inflated: enough to find metadata, outlines and attachments."""
    chunks = [pdf]
    for match in re.finditer(rb"stream\r?\n(.*?)endstream", pdf, re.S):
        try:
            chunks.append(zlib.decompressobj().decompress(match.group(1)))
        except zlib.error:
            continue
    return b"\n".join(chunks)
