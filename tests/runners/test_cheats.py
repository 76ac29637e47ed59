"""Adversarial candidates get the right verdict and reason code; honest ones are accepted.

Every file in tests/runners/cheats/ (except probe_*) declares its workload, verdict and expected
codes in its header; one sandbox session serves all of them so the whole file stays fast.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from runners import measure
from runners.evaluate import AuditSession, audit_candidate
from runners.sandbox import SandboxConfig

HERE = Path(__file__).resolve().parent
# probe_* report what the sandbox lets them do (test_sandbox.py); gpu_* need a device this CI lacks.
CHEATS = sorted(p for p in (HERE / "cheats").glob("*.py") if not p.name.startswith(("probe_", "sabotage_", "gpu_")))
# Short timeouts so the hanging cheats end in seconds (cheats need no compile time), yet long
# enough that an honest call on a loaded two-core CI box never reaches them.
FAST = replace(measure.protocol_for("cpu-ci"), load_timeout_s=10.0, first_call_timeout_s=8.0, call_timeout_floor_s=6.0)


def _header(path: Path) -> dict[str, str]:
    fields = dict(re.findall(r"^# ([a-z-]+): (.+)$", path.read_text(), flags=re.MULTILINE))
    assert {"workload", "verdict"} <= fields.keys(), f"{path.name} lacks its test header"
    return fields


@pytest.fixture(scope="module")
def session():
    # A 3 GiB address-space limit makes the memory blow-up end in a second instead of at 8 GiB.
    with AuditSession(device="cpu", config=SandboxConfig(device="cpu", memory_bytes=3 << 30, threads=1)) as shared:
        yield shared


def _codes(document: dict) -> set[str]:
    return {reason["code"] for workload in document["workloads"] for reason in workload["reasons"]}


@pytest.mark.parametrize("path", CHEATS, ids=lambda p: p.stem)
def test_it_rejects_each_cheat_with_its_reason_code(session, path, request):
    header = _header(path)
    if "open" in header:
        # A weakness known and not closed yet: the test must keep failing until it is (strict), so
        # closing it, or a cheat that stops working for another reason, is noticed.
        request.applymarker(pytest.mark.xfail(strict=True, reason=header["open"]))
    if "unsettled" in header:
        # Caught in most runs but not all: its hidden work sits near the allowance. Reported, not
        # hidden: the run's outcome shows as XFAIL or XPASS.
        request.applymarker(pytest.mark.xfail(strict=False, reason=header["unsettled"]))
    document = audit_candidate(header["workload"], path.read_text(), profile="cpu-ci", seed=7, protocol=FAST, session=session)
    codes = _codes(document)
    if header["verdict"] == "no-gain" and document["verdict"] == "accepted":
        # A trick the harness makes pointless rather than detects: accepted, slower, and no gain
        # billable. Proven slower where the interval allows; beside a busy core the A/A widening
        # put one's top at 1.64 over a point of 0.95 (2026-12-06), and then the point must be below 1.
        workload = document["workloads"][0]
        ci95 = workload["ci95"]
        assert ci95 is not None and ci95[0] < 1.0 and (ci95[1] < 1.0 or workload["speedup"] < 1.0), (workload["speedup"], ci95)
        return
    if header["verdict"] == "no-billable-gain" and document["verdict"] == "accepted":
        # The figure the trick moved no longer bills: accepted, at no proven gain.
        workload = document["workloads"][0]
        assert workload["ci95"] is not None and workload["ci95"][0] <= 1.0, (workload["ci95"], workload["billable"])
        return
    if "if-missed" in header and document["verdict"] == "accepted":
        # A cheat whose effect depends on where in time its work lands: on a loaded box the work can
        # land where it moves no figure (its own windows, the gaps between samples), and nothing is
        # caught because nothing moved. Accepted, it must have proven no gain and bill nothing: either
        # its figure is not billable, or the bound that bills is no speedup (metering bills 1x for it).
        workload = document["workloads"][0]
        bills = workload["billable_speedup"]
        assert workload["ci95"] is not None and workload["ci95"][0] <= 1.0, (workload["ci95"], workload["timing"].get("cpu_while_others_measured_s"))
        assert workload["billable"] is False or (bills is not None and bills <= 1.0), (workload["billable"], bills)
        return
    assert document["verdict"] == re.sub(r"^no-(billable-)?gain$", "rejected", header["verdict"]), (document["verdict"], document["workloads"][0]["reasons"])
    expected_all = {c.strip() for c in header.get("expect", "").split(",") if c.strip()}
    assert expected_all <= codes, f"missing {expected_all - codes}; got {document['workloads'][0]['reasons']}"
    expected_any = {c.strip() for c in header.get("expect-any", "").split("|") if c.strip()}
    if expected_any:
        assert expected_any & codes, f"none of {expected_any}; got {document['workloads'][0]['reasons']}"
    for workload in document["workloads"]:
        assert workload["speedup"] is None and workload["ci95"] is None  # never a speedup without correctness
        assert workload["billable"] is False


@pytest.mark.parametrize(
    "filename, workload",
    [
        ("rmsnorm_alternative.py", "rmsnorm"),
        ("softmax_alternative.py", "softmax"),
        ("gemm_einsum.py", "gemm"),
        ("attention_prefill_manual.py", "attention_prefill"),
        ("moe_dense.py", "moe"),
        ("ssm_scan_logspace.py", "ssm_scan"),
    ],
)
def test_it_accepts_honest_alternative_formulations(session, filename, workload):
    document = audit_candidate(workload, (HERE / "honest" / filename).read_text(), profile="cpu-ci", seed=11, session=session)
    entry = document["workloads"][0]
    assert document["verdict"] == "accepted", entry["reasons"]
    assert entry["correctness"]["passed"] is True
    assert all(value is True for value in entry["correctness"]["checks"].values()), entry["correctness"]["checks"]
    assert entry["speedup"] > 0 and entry["ci95"][0] <= entry["speedup"] <= entry["ci95"][1]


@pytest.mark.slow  # Inductor compiles C++ on the first call: ~20 s on two cores
def test_it_accepts_a_torch_compiled_candidate(session):
    source = (HERE / "honest" / "rmsnorm_compiled.py").read_text()
    document = audit_candidate("rmsnorm", source, profile="cpu-ci", seed=12, session=session)
    assert document["verdict"] == "accepted", document["workloads"][0]["reasons"]


def test_it_accepts_the_baseline_itself_with_a_speedup_near_one(session):
    from runners import suite

    spec = suite.find_spec("cpu-ci", "gemm")[0]
    document = audit_candidate("gemm", suite.baseline_source(spec), profile="cpu-ci", seed=13, session=session)
    entry = document["workloads"][0]
    assert document["verdict"] == "accepted", entry["reasons"]
    # The same code on both sides: the interval must straddle or sit next to 1 (loose: shared CI box).
    assert entry["ci95"][0] < 1.25 and entry["ci95"][1] > 0.8


def test_it_keeps_the_baseline_out_of_reach_of_a_sabotaging_candidate(session):
    # The candidate makes F.rms_norm sleep 50 ms in its own process. Were the baseline timed there,
    # its median would exceed 50 ms; a separate trusted worker keeps it at microseconds.
    source = (HERE / "cheats" / "sabotage_baseline.py").read_text()
    document = audit_candidate("rmsnorm", source, profile="cpu-ci", seed=14, protocol=FAST, session=session)
    entry = document["workloads"][0]
    assert document["verdict"] == "accepted", entry["reasons"]
    assert entry["baseline"]["median_s"] < 0.01
    assert entry["speedup"] < 3.0


def test_a_samples_first_call_bills_like_any_other(session):
    # 12 ms of waiting in each request's first call, against cpu-ci rmsnorm samples of a few ms: an
    # honest cold start is accepted, and billed (an unbilled call 0 was a window where any
    # input-independent work of the later calls was free: adv9_first_call_hoist.py).
    source = (HERE / "honest" / "rmsnorm_slow_first_call.py").read_text()
    document = audit_candidate("rmsnorm", source, profile="cpu-ci", seed=15, session=session)
    entry = document["workloads"][0]
    assert document["verdict"] == "accepted", entry["reasons"]
    # Unbilled, the first call's wait would leave the figure at 1.0; billed, 0.16-0.20 (three seeds
    # beside a busy core, 2026-12-06). Judged on the rounds' own interval. With 3 ms (0.53-0.73x) a
    # loaded CI box once put the interval's top at 1.006 above a point of 0.73: the wait is 12 ms now.
    assert entry["speedup"] < 0.6 and entry["ci95_rounds"][1] < 0.8, (entry["speedup"], entry["ci95_rounds"], entry["ci95"])
