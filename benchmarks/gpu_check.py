"""The one-shot GPU check: proves the GPU path in one short run on a machine lent for minutes.

    make gpu-check                      # on the GPU machine: its python3, no install
    make gpu-check DRY_RUN=1            # here: cpu-ci shapes, Triton's interpreter (CI runs this)

Phases, each with its own time budget, each skipped with a reason rather than failing the run:
machine (the GPU, its copy bandwidth and bf16 matmul rate: the physical references for every figure
after it), kernels (the optimizer's Triton kernel tests, compiled for real), harness (A/A audits of
the `gpu` profile's workloads with their CI half-widths), optimizer (tuned and audited: speedup over
eager and over torch.compile, bandwidth as a share of the measured copy bandwidth for memory-bound
workloads, TFLOP/s for GEMM, attention and MoE), cheats (the GPU cheats must still get their
verdicts), model (the whole-model audit, the billing basis of model runs, on a tiny Llama: prefill
and decode stepped call by call on the device, with an A/A control) and sandbox (which protections
the host gives).

Results are written after every phase to one JSON file (a run cut short still returns what it
measured) and a short table last. Needs torch, triton, numpy and transformers; jsonschema and
pytest travel as wheels in `.whl/` (`make gpu-wheels`) where the machine lacks them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
MEMORY_BOUND = {"normalization", "softmax", "elementwise", "rope"}
COMPUTE = {"gemm", "attention", "moe"}
# Seconds per phase on one H200; the whole run stays well inside 8 minutes.
GPU_BUDGETS = {"machine": 30, "kernels": 110, "harness": 90, "optimizer": 130, "cheats": 45, "model": 50, "sandbox": 90}
DRY_BUDGETS = {"machine": 20, "kernels": 240, "harness": 60, "optimizer": 90, "cheats": 60, "model": 60, "sandbox": 5}
# Phase order inside a budget: a memory-bound kernel, a GEMM, attention first, the rest if time allows.
WORKLOAD_ORDER = ["rmsnorm", "gemm", "attention_prefill", "swiglu", "softmax", "attention_decode", "rope",
                  "layernorm", "moe", "ssm_scan"]
SELECTED = set(WORKLOAD_ORDER)  # --workloads narrows it
HARD_STOP_GRACE_S = 15.0  # a phase is stopped at 1.5 x its budget plus this


class Check:
    """The run's document, written to disk after every change."""

    def __init__(self, path: Path, *, dry_run: bool, command: str) -> None:
        self.path = path
        self.started = time.monotonic()
        self.doc: dict[str, Any] = {
            "check": "dyno gpu check", "dry_run": dry_run, "command": command,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "phases": {},
        }
        self.save()

    def save(self) -> None:
        self.doc["wall_s"] = round(time.monotonic() - self.started, 1)
        staging = self.path.with_name(self.path.name + ".new")
        staging.write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        staging.replace(self.path)

    def phase(self, name: str, budget_s: float, body: Callable[[dict[str, Any], float], None]) -> dict[str, Any]:
        """Run `body(record, deadline)`; the record is saved as it stands whatever happens."""
        record: dict[str, Any] = {"status": "running", "budget_s": budget_s}
        self.doc["phases"][name] = record
        self.save()
        began = time.monotonic()
        # A phase that outruns its budget by half again is stopped where it stands (an exception
        # raised in the main thread; the harness's own cleanup closes its workers), so one stuck
        # phase cannot spend the others' minutes: on the second H200 run one A/A audit took the
        # whole call.
        hard_stop = budget_s * 1.5 + HARD_STOP_GRACE_S
        previous = signal.signal(signal.SIGALRM, _overrun)
        signal.setitimer(signal.ITIMER_REAL, hard_stop)
        try:
            body(record, began + budget_s)
            if record["status"] == "running":
                record["status"] = "ok"
        except _Skip as skip:
            record.update(status="skipped", reason=str(skip))
        except _Overrun:
            record.update(status="overran", reason=f"stopped after {hard_stop:.0f} s (budget {budget_s} s)",
                          traceback=traceback.format_exc()[-3000:])
        except BaseException as exc:  # noqa: BLE001 - a phase's failure is a finding, not the end of the run
            record.update(status="error", error=f"{type(exc).__name__}: {exc}"[:2000],
                          traceback=traceback.format_exc()[-3000:])
            if isinstance(exc, KeyboardInterrupt):
                raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            record["seconds"] = round(time.monotonic() - began, 1)
            self.save()
        print(f"[{self.doc['wall_s']:6.1f} s] {name}: {record['status']}"
              + (f" ({record.get('reason') or record.get('error')})" if record["status"] != "ok" else ""), flush=True)
        return record


class _Skip(Exception):
    pass


class _Overrun(Exception):
    pass


def _overrun(signum: int, frame: Any) -> None:
    raise _Overrun("the phase ran past its hard stop")


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _tracker(record: dict[str, Any], state: dict) -> Callable[[float, str], None]:
    """An audit's progress callback: the phase's record keeps the last note and when it came (saved
    at most every 5 s), so a phase stopped at its hard stop says which round of which audit it was
    in (on the H100 run of 2026-12-06 three phases overran and said only where Python was)."""
    began = time.monotonic()
    last_save = [0.0]

    def note(fraction: float, message: str) -> None:
        now = time.monotonic()
        record["last_note"] = {"at_s": round(now - began, 1), "note": message[:300]}
        if now - last_save[0] > 5.0:
            last_save[0] = now
            state["save"]()

    return note


# --- machine ---------------------------------------------------------------------------------------


def phase_machine(record: dict[str, Any], deadline: float, *, device: str) -> None:
    import torch
    import triton

    record["versions"] = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
                          "cuda": torch.version.cuda}
    try:
        import transformers

        record["versions"]["transformers"] = transformers.__version__
    except ImportError:
        record["versions"]["transformers"] = None
    if device == "cuda":
        if not torch.cuda.is_available():
            raise _Skip("no CUDA device is visible to torch")
        props = torch.cuda.get_device_properties(0)
        record["gpu"] = {"name": props.name, "sms": props.multi_processor_count,
                         "memory_gib": round(props.total_memory / 2**30, 1),
                         "l2_bytes": getattr(props, "L2_cache_size", None),
                         "capability": f"{props.major}.{props.minor}"}
        record["gpu"].update(_nvidia_smi())
    else:
        record["cpu"] = {"model": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    record["copy_gb_per_s"] = _copy_bandwidth(device)
    record["matmul_tflop_per_s"] = _matmul_rate(device)


def _nvidia_smi() -> dict[str, Any]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,uuid,clocks.max.sm,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {"driver": None}
    fields = [f.strip() for f in out.splitlines()[0].split(",")] if out.strip() else []
    keys = ("driver", "uuid", "max_sm_clock", "power_limit")
    return dict(zip(keys, fields)) if fields else {"driver": None}


def _timed(device: str, fn: Callable[[], Any], repeats: int) -> float:
    """Seconds per call of fn, after a warm-up, on the device's own clock."""
    import torch

    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - began) / repeats


def _copy_bandwidth(device: str) -> float:
    """Device-to-device copy: bytes read plus bytes written per second, in GB/s."""
    import torch

    nbytes = (2 << 30) if device == "cuda" else (64 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    seconds = _timed(device, lambda: dst.copy_(src), 20 if device == "cuda" else 5)
    return round(2 * nbytes / seconds / 1e9, 1)


def _matmul_rate(device: str) -> float:
    import torch

    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    seconds = _timed(device, lambda: a @ b, 20 if device == "cuda" else 3)
    return round(2 * n**3 / seconds / 1e12, 2)


# --- kernels ---------------------------------------------------------------------------------------


def phase_kernels(record: dict[str, Any], deadline: float, *, device: str, selection: str = "") -> None:
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise _Skip("pytest is not installed here: carry it in .whl (make gpu-wheels)") from None
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "kernels.xml"
        env = {**os.environ, "DYNO_KERNEL_TEST_DEVICE": device, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        if device == "cuda":
            env.pop("TRITON_INTERPRET", None)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:django", "-o", "addopts=",
                   "--import-mode=importlib", "--confcutdir", str(ROOT / "tests" / "optimizer"),
                   f"--junitxml={junit}", str(ROOT / "tests" / "optimizer" / "test_optimizer_kernels.py")]
        if selection:
            command += ["-k", selection]
        try:
            proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=max(5.0, _left(deadline)))
        except subprocess.TimeoutExpired:
            record.update(status="error", error="the kernel tests outlasted the phase's budget")
            return
        record["exit_code"] = proc.returncode
        record["output_tail"] = (proc.stdout + proc.stderr)[-2500:]
        if not junit.exists():
            record.update(status="error", error="pytest wrote no report")
            return
        suite = ElementTree.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        record["tests"] = counts
        record["failed"] = [case.get("name") for case in suite.iter("testcase")
                            if case.find("failure") is not None or case.find("error") is not None][:40]
        # What each failure said (its message and the end of its traceback): the run is the only
        # place a GPU answer comes from, so the answer must come back with it.
        record["failures"] = {}
        for case in suite.iter("testcase"):
            found = case.find("failure") if case.find("failure") is not None else case.find("error")
            if found is not None and len(record["failures"]) < 40:
                text = (found.text or "").strip()
                record["failures"][case.get("name")] = {"message": (found.get("message") or "")[:400], "tail": text[-700:]}
        if counts["failures"] or counts["errors"] or not counts["tests"]:
            record["status"] = "failed"


# --- harness A/A -----------------------------------------------------------------------------------


def _ordered_names(profile: str) -> list[str]:
    from runners import suite

    present = {spec.name for spec in suite.profile_specs(profile)}
    return [name for name in WORKLOAD_ORDER if name in present and name in SELECTED]


def _entry_row(entry: dict[str, Any]) -> dict[str, Any]:
    aa = entry.get("aa") or {}
    ci = aa.get("ci95") or [None, None]
    half = (ci[1] - ci[0]) / 2 / aa["speedup"] if aa.get("speedup") and None not in ci else None
    return {"key": entry.get("key"), "verdict": entry.get("verdict"), "aa_ci95": ci, "aa_half_width": half,
            "aa_stable": aa.get("stable"), "baseline_median_s": (entry.get("baseline") or {}).get("median_s"),
            "codes": [r.get("code") for r in entry.get("reasons") or []],
            **_failure(entry)}


FAILED = ("error", "rejected")


def _failure(entry: dict[str, Any]) -> dict[str, str]:
    """What an audit that failed said, short enough to read in the table's JSON ({} otherwise)."""
    if entry.get("verdict") not in FAILED:
        return {}
    for reason in entry.get("reasons") or []:
        text = str(reason.get("detail") or reason.get("message") or "")
        if text:
            return {"error": text[:600]}
    return {"error": ""}


def _fail_on_errors(record: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """A phase whose audits ended in `error` or `rejected` did not prove what it exists to prove:
    the baseline against itself and Dyno's own kernels must pass every check (on the first H200
    run every audit was rejected for its commitments, and the phase still said ok)."""
    errors = [r["key"] for r in rows if r.get("verdict") in FAILED]
    if errors:
        record.update(status="failed", errors=errors)


def phase_harness(record: dict[str, Any], deadline: float, *, profile: str, device: str, state: dict) -> None:
    from runners.evaluate import run_suite

    rows: list[dict[str, Any]] = record.setdefault("workloads", [])
    for name in _ordered_names(profile):
        if _left(deadline) < (25 if device == "cuda" else 10):
            record.setdefault("not_reached", []).append(name)
            continue
        began = time.monotonic()
        document = run_suite(profile, workloads=[name], device=device, seed=17, progress=_tracker(record, state))
        state.setdefault("sandbox", document.get("sandbox"))
        for entry in document["workloads"]:
            rows.append({**_entry_row(entry), "seconds": round(time.monotonic() - began, 1)})
            print(f"    harness {rows[-1]['key']}: {rows[-1]['verdict']} in {rows[-1]['seconds']} s", flush=True)
        state["save"]()  # a run cut short still returns every audit it finished
        if rows and all(r["verdict"] in FAILED for r in rows):
            # Workers that cannot measure at all fail every audit alike: say why once and leave
            # the minutes to the phases that can still answer (the sandbox phase probes why).
            state["workers_failed"] = rows[0].get("error") or "the first audit ended in error"
            record["stopped"] = f"stopped after {name}: every audit so far ended in error"
            break
    widths = sorted(r["aa_half_width"] for r in rows if r["aa_half_width"] is not None)
    record["median_aa_half_width"] = widths[len(widths) // 2] if widths else None
    record["unstable"] = sum(1 for r in rows if r["aa_stable"] is False)
    _fail_on_errors(record, rows)


# --- optimizer -------------------------------------------------------------------------------------


def phase_optimizer(record: dict[str, Any], deadline: float, *, profile: str, device: str,
                    copy_gb_per_s: float | None, state: dict) -> None:
    from pipeline.optimized import run_optimized_suite

    points = ["torch-compile"] if device == "cpu" else ["torch-compile", "torch-compile-max-autotune"]
    rows: list[dict[str, Any]] = record.setdefault("workloads", [])
    budget = 6.0 if device == "cuda" else 3.0
    with tempfile.TemporaryDirectory() as scratch:
        for name in _ordered_names(profile):
            if _left(deadline) < (35 if device == "cuda" else 15):
                record.setdefault("not_reached", []).append(name)
                continue
            document = run_optimized_suite(profile, workloads=[name], device=device,
                                           cache_path=Path(scratch) / "tuning.jsonl", budget_s=budget, seed=23,
                                           reference_points=points if _left(deadline) > 90 else points[:1],
                                           progress=_tracker(record, state))
            for entry in document["workloads"]:
                rows.append(_optimizer_row(entry, copy_gb_per_s))
            state["save"]()
    speedups = [r["speedup"] for r in rows if r.get("speedup")]
    record["geomean_over_eager"] = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None
    over = [r["over_torch_compile"] for r in rows if r.get("over_torch_compile")]
    record["geomean_over_torch_compile"] = math.exp(sum(map(math.log, over)) / len(over)) if over else None
    _fail_on_errors(record, rows)


def _optimizer_row(entry: dict[str, Any], copy_gb_per_s: float | None) -> dict[str, Any]:
    speedup = entry.get("speedup")
    refs = entry.get("reference_points") or {}
    row: dict[str, Any] = {"key": entry.get("key"), "family": entry.get("family"), "verdict": entry.get("verdict"),
                           "speedup": speedup, "ci95": entry.get("ci95"),
                           "codes": [r.get("code") for r in entry.get("reasons") or []],
                           **_failure(entry)}
    for point, figures in refs.items():
        versus = figures.get("speedup_vs_baseline")
        row[f"over_{point.replace('-', '_')}"] = speedup / versus if speedup and versus else None
    candidate = (entry.get("throughput") or {}).get("candidate") or {}
    if entry.get("family") in MEMORY_BOUND and candidate.get("gb_per_s") and copy_gb_per_s:
        row["share_of_copy_bandwidth"] = candidate["gb_per_s"] / copy_gb_per_s
    if entry.get("family") in COMPUTE:
        row["tflop_per_s"] = candidate.get("tflop_per_s")
    return row


# --- cheats ----------------------------------------------------------------------------------------


def _header(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^# ([a-z-]+): (.+)$", path.read_text(), flags=re.MULTILINE))


def phase_cheats(record: dict[str, Any], deadline: float, *, profile: str, device: str, state: dict) -> None:
    from runners.evaluate import audit_candidate

    folder = ROOT / "tests" / "runners" / "cheats"
    if device == "cuda":
        paths = sorted(folder.glob("gpu_*.py"))
    else:  # the GPU cheats need a device: exercise the phase with CPU cheats of the selected workloads
        paths = [p for p in (folder / "adv_known_picks.py", folder / "adv_timed_fastpath.py")
                 if _header(p)["workload"] in SELECTED]
    rows = record.setdefault("cheats", [])
    for path in paths:
        header = _header(path)
        if _left(deadline) < 8:
            record.setdefault("not_reached", []).append(path.name)
            continue
        document = audit_candidate(header["workload"], path.read_text(), profile=profile, device=device, seed=7,
                                   progress=_tracker(record, state))
        expected = header.get("verdict", "rejected").replace("no-gain", "accepted")
        codes = sorted({r.get("code") for w in document["workloads"] for r in w.get("reasons") or []})
        rows.append({"cheat": path.name, "expected": expected, "verdict": document["verdict"], "codes": codes,
                     "as_expected": document["verdict"] == expected})
        state["save"]()
    if any(not row["as_expected"] for row in rows):
        record["status"] = "failed"


# --- sandbox ---------------------------------------------------------------------------------------


def phase_model(record: dict[str, Any], deadline: float, *, profile: str, device: str) -> None:
    """The whole-model audit on the device: eager against eager (no artifact), so the figure must be
    ~1x, with its A/A control; what it proves is the stepped, parent-clocked sample, the device-wide
    sync before each commitment and the logit checks on this machine."""
    from runners.modelaudit import audit_model_forward
    from runners.samples import write_sample_model

    if _left(deadline) < 15:
        raise _Skip("no time left in the phase's budget")
    # 8 rounds on CPU: at 4 the integrity judges' bootstrap bounds are nearly the rounds' extremes,
    # and one busy stretch of a loaded CI box rejected eager decode against itself (2026-12-06).
    batch, seq, rounds = (2, 16, 8) if device == "cpu" else (2, 64, 15)
    with tempfile.TemporaryDirectory(prefix="dyno-gpu-model-") as scratch:
        model = write_sample_model(Path(scratch) / "llama", "llama")
        report = audit_model_forward(model, None, batch=batch, seq=seq, device=device, profile=profile, seed=29,
                                     rounds=rounds, reference_points=())
    record.update(shape={"batch": batch, "seq": seq}, seconds_audit=round(report["seconds"], 1), phases=[{
        "phase": p["phase"], "verdict": p["verdict"], "speedup": p["speedup"], "ci95": p["ci95"],
        "aa": p["aa"], "rounds": p["rounds"], "calls_per_sample": p.get("calls_per_sample"),
        "baseline_median_s": p["baseline_median_s"], "reasons": [r["code"] for r in p["reasons"]],
        "note": p.get("note")} for p in report["phases"]])
    audited = [p for p in record["phases"] if p["verdict"] != "skipped"]
    if not audited or any(p["verdict"] != "accepted" for p in audited):
        record["status"] = "failed"  # the same model on both sides must be accepted


def phase_sandbox(record: dict[str, Any], deadline: float, *, device: str, state: dict) -> None:
    sandbox = state.get("sandbox")
    if sandbox is None:
        from runners.evaluate import AuditSession, sandbox_block

        with AuditSession(device=device) as session:
            sandbox = sandbox_block(session.sandbox.info())
    record["sandbox"] = sandbox
    # The harness's own judgement (runners.evaluate.sandbox_block): what a billable result needs and lacks.
    record["complete"] = (sandbox or {}).get("complete")
    record["missing"] = list((sandbox or {}).get("missing") or [])
    record["off"] = sorted(name for name, value in ((sandbox or {}).get("protections") or {}).items() if value is False)
    if device == "cuda" and state.get("workers_failed"):
        # Which step of the lock-down keeps the device from starting (benchmarks/gpu_lockdown_probe.py).
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "probe.json"
            proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_lockdown_probe.py"), "--json", str(report)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=max(20.0, _left(deadline)))
            record["lockdown_probe"] = json.loads(report.read_text()) if report.exists() else {"output_tail": (proc.stdout + proc.stderr)[-2000:]}


# --- the run ---------------------------------------------------------------------------------------


def table(doc: dict[str, Any]) -> str:
    phases = doc["phases"]
    lines = [f"dyno gpu check ({'dry run, ' if doc['dry_run'] else ''}{doc['wall_s']:.0f} s)"]
    machine = phases.get("machine", {})
    if machine.get("status") == "ok":
        gpu = machine.get("gpu") or machine.get("cpu")
        lines.append(f"  machine: {gpu}; copy {machine['copy_gb_per_s']} GB/s, matmul {machine['matmul_tflop_per_s']} TFLOP/s")
    for name, record in phases.items():
        extra = ""
        if name == "kernels" and "tests" in record:
            extra = f" {record['tests']}"
        if name == "harness" and record.get("workloads"):
            width = record.get("median_aa_half_width")
            extra = (f" {len(record['workloads'])} A/A audits, median half-width "
                     f"{width:.1%}" if width is not None else "") + f", {record.get('unstable', 0)} unstable"
        if name == "optimizer" and record.get("workloads"):
            mean = record.get("geomean_over_eager")
            extra = f" {len(record['workloads'])} workloads" + (f", geomean {mean:.2f}x over eager" if mean else "")
        if name == "cheats" and record.get("cheats"):
            extra = f" {sum(r['as_expected'] for r in record['cheats'])}/{len(record['cheats'])} as expected"
        if name == "model" and record.get("phases"):
            extra = " " + "; ".join(f"{p['phase']} {p['verdict']}" + (f" {p['speedup']:.3f}x, A/A {p['aa']['speedup']:.3f}"
                                                                      if p.get("speedup") and (p.get("aa") or {}).get("speedup") else "")
                                    + (f" ({', '.join(p['reasons'])})" if p.get("reasons") else "")
                                    for p in record["phases"])
        if name == "sandbox" and "missing" in record:
            extra = (f" complete: {record.get('complete')}, missing for billing: {', '.join(record['missing']) or 'none'}"
                     f", off: {', '.join(record.get('off') or []) or 'none'}")
        lines.append(f"  {name:10s} {record.get('status')}{extra} ({record.get('seconds', 0)} s)")
    for row in (phases.get("optimizer") or {}).get("workloads", []):
        share = row.get("share_of_copy_bandwidth")
        rate = row.get("tflop_per_s")
        lines.append(f"    {row['key']}: {row['verdict']} {row['speedup'] or 0:.2f}x"
                     + (f", {row['over_torch_compile']:.2f}x over torch.compile" if row.get("over_torch_compile") else "")
                     + (f", {share:.0%} of copy bandwidth" if share else "") + (f", {rate:.1f} TFLOP/s" if rate else ""))
    return "\n".join(lines)


# Phases that measure in sandboxed workers: pointless once the harness phase showed none can.
NEED_WORKERS = {"optimizer", "cheats", "model"}


def _after_working_audits(body: Callable[[dict[str, Any], float], None], state: dict) -> Callable[[dict[str, Any], float], None]:
    def run(record: dict[str, Any], deadline: float) -> None:
        if state.get("workers_failed"):
            raise _Skip(f"workers could not measure in the harness phase: {state['workers_failed'][:300]}")
        body(record, deadline)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="cpu-ci shapes on CPU, Triton's interpreter")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu-check.json (default: $OUT or benchmarks/results)")
    parser.add_argument("--only", default="", help="comma-separated phases (default: all)")
    parser.add_argument("--workloads", default="", help="comma-separated workloads (default: all, in budget order)")
    parser.add_argument("--kernel-tests", default="", metavar="EXPR", help="pytest -k expression for the kernel tests")
    args = parser.parse_args(argv)
    if args.workloads:
        SELECTED.intersection_update(w for w in args.workloads.split(",") if w)
    dry = args.dry_run or os.environ.get("DRY_RUN") in ("1", "true", "yes")
    if dry:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere
    sys.path[:0] = [str(ROOT)]
    out = args.out or Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    name = "gpu-check-dry-run" if dry else "gpu-check"
    check = Check(out / f"{name}.json", dry_run=dry, command=" ".join(["python", "benchmarks/gpu_check.py", *(argv or sys.argv[1:])]))
    device, profile = ("cpu", "cpu-ci") if dry else ("cuda", "gpu")
    budgets = DRY_BUDGETS if dry else GPU_BUDGETS
    wanted = [p for p in args.only.split(",") if p] or list(budgets)
    state: dict[str, Any] = {"save": check.save}
    plan: list[tuple[str, Callable[[dict[str, Any], float], None]]] = [
        ("machine", lambda r, d: phase_machine(r, d, device=device)),
        ("kernels", lambda r, d: phase_kernels(r, d, device=device, selection=args.kernel_tests)),
        ("harness", lambda r, d: phase_harness(r, d, profile=profile, device=device, state=state)),
        ("optimizer", lambda r, d: phase_optimizer(r, d, profile=profile, device=device,
                                                   copy_gb_per_s=check.doc["phases"].get("machine", {}).get("copy_gb_per_s"),
                                                   state=state)),
        ("cheats", lambda r, d: phase_cheats(r, d, profile=profile, device=device, state=state)),
        ("model", lambda r, d: phase_model(r, d, profile=profile, device=device)),
        ("sandbox", lambda r, d: phase_sandbox(r, d, device=device, state=state)),
    ]
    for phase, body in plan:
        if phase in wanted:
            check.phase(phase, budgets[phase], _after_working_audits(body, state) if phase in NEED_WORKERS else body)
    text = table(check.doc)
    (out / f"{name}.txt").write_text(text + "\n")
    print(text)
    bad = [p for p, r in check.doc["phases"].items() if r["status"] in ("error", "failed", "overran")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
