"""What a reader sees of a report: summary, workload rows, charts, environment, reproduction.
Built from the signed body alone (pure), so the page, the PDF and the comparison agree with it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from reports.document import as_interval, as_number, flatten, not_billable_text, shape_text, workload_label

REFERENCE_LABELS = {"torch-compile": "torch.compile"}
VERDICT_COLOURS = {"accepted": "#1d7d3a", "rejected": "#b3261e", "error": "#9a6700"}


@dataclass(frozen=True)
class ReferenceCell:
    name: str
    median: str
    speedup_vs_baseline: float | None
    optimized_vs_reference: float | None  # > 1: the optimized kernel beats this reference too


@dataclass(frozen=True)
class WorkloadRow:
    name: str
    label: str
    family: str
    shape: str
    dtype: str
    baseline_impl: str
    baseline_median: str
    candidate_median: str
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    verdict: str
    correctness_passed: bool | None
    max_abs_err: float | None
    max_rel_err: float | None
    atol: float | None
    rtol: float | None
    references: tuple[ReferenceCell, ...]
    reasons: tuple[str, ...]
    billable: bool
    billable_speedup: str | None
    not_billable: str

    @property
    def abs_error_text(self) -> str:
        return f"{_sci(self.max_abs_err)} / {_sci(self.atol)}"

    @property
    def rel_error_text(self) -> str:
        return f"{_sci(self.max_rel_err)} / {_sci(self.rtol)}"

    @property
    def error_fraction(self) -> float | None:
        """max abs error as a fraction of the tolerance: under 1 passes."""
        if self.max_abs_err is None or not self.atol:
            return None
        return self.max_abs_err / self.atol


@dataclass(frozen=True)
class Summary:
    kind: str
    organization: str
    model_name: str
    model_version: int | None
    architecture: str
    hardware: str
    device: str
    suite_version: str
    suite_profile: str
    manifest_sha256: str
    model_speedup: str | None
    model_ci_low: str | None
    model_ci_high: str | None
    billable: bool
    billable_speedup: str | None
    not_billable: tuple[str, ...]
    stable: bool
    aa_speedup: float | None
    aa_ci: tuple[float, float] | None
    accepted: int
    rejected: int
    errors: int
    geomean: float | None
    verdict: str | None
    finished_at: str
    run_id: str
    artifact_sha256: str | None
    supersedes: dict[str, Any] | None


@dataclass(frozen=True)
class ReportView:
    summary: Summary
    rows: tuple[WorkloadRow, ...]
    environment: tuple[tuple[str, str], ...]
    files: tuple[dict[str, Any], ...]
    reproduce: dict[str, Any]
    contract_baseline: str
    billing_rule: str
    charts: dict[str, Any]


def report_view(body: dict[str, Any]) -> ReportView:
    result = body.get("result") or {}
    billing = body.get("billing") or {}
    rows = tuple(_row(w, b) for w, b in zip(result.get("workloads") or [], _billing_rows(billing, result)))
    return ReportView(
        summary=_summary(body, result, billing),
        rows=rows,
        environment=tuple((k, _plain(v)) for k, v in flatten(body.get("environment") or {})),
        files=tuple((body.get("model_version") or {}).get("files") or []),
        reproduce=body.get("reproduce") or {},
        contract_baseline=body.get("contract_baseline", ""),
        billing_rule=billing.get("rule", ""),
        charts=charts(body, rows),
    )


def _billing_rows(billing: dict[str, Any], result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = list(billing.get("workloads") or [])
    return rows + [{}] * (len(result.get("workloads") or []) - len(rows))


def _summary(body: dict[str, Any], result: dict[str, Any], billing: dict[str, Any]) -> Summary:
    model = body.get("model_version") or {}
    if not model:  # the audit of a submitted candidate: name it by workload and source hash
        candidate = result.get("candidate") or {}
        model = {"name": f"{candidate.get('workload', '?')} candidate {str(candidate.get('source_sha256', ''))[:12]}",
                 "architecture": candidate.get("label", "submitted candidate")}
    suite = body.get("suite") or {}
    calibration = result.get("calibration") or {}
    counts = result.get("summary") or {}
    figure = billing.get("model") or {}
    environment = body.get("environment") or {}
    reasons = tuple(r.get("message", r.get("code", "")) for r in billing.get("reasons") or [])
    return Summary(
        kind=body.get("kind", ""), organization=body.get("organization", ""),
        model_name=model.get("name", ""), model_version=model.get("version"),
        architecture=model.get("architecture", ""),
        hardware=(body.get("run") or {}).get("hardware", ""),
        device=str(environment.get("device") or environment.get("gpu") or environment.get("cpu") or "—"),
        suite_version=str(suite.get("version") or "—"), suite_profile=str(suite.get("profile") or "—"),
        manifest_sha256=str(suite.get("manifest_sha256") or "—"),
        model_speedup=figure.get("speedup"), model_ci_low=figure.get("ci95_low"),
        model_ci_high=figure.get("ci95_high"),
        billable=bool(billing.get("billable")), billable_speedup=figure.get("billable_speedup"),
        not_billable=reasons, stable=bool(billing.get("calibration_stable")),
        aa_speedup=as_number(calibration.get("aa_speedup")), aa_ci=as_interval(calibration.get("aa_ci95")),
        accepted=int(counts.get("accepted") or 0), rejected=int(counts.get("rejected") or 0),
        errors=int(counts.get("errors") or 0), geomean=as_number(counts.get("geomean_speedup")),
        verdict=body.get("verdict"), finished_at=(body.get("run") or {}).get("finished_at", ""),
        run_id=(body.get("run") or {}).get("id", ""), artifact_sha256=body.get("artifact_sha256"),
        supersedes=body.get("supersedes"),
    )


def _row(workload: dict[str, Any], billing: dict[str, Any]) -> WorkloadRow:
    baseline, candidate = workload.get("baseline") or {}, workload.get("candidate") or {}
    correctness = workload.get("correctness") or {}
    ci = as_interval(workload.get("ci95"))
    candidate_median = as_number(candidate.get("median_s"))
    references = []
    for name, point in sorted((workload.get("reference_points") or {}).items()):
        median = as_number((point or {}).get("median_s"))
        references.append(ReferenceCell(
            name=REFERENCE_LABELS.get(name, name), median=duration(median),
            speedup_vs_baseline=as_number((point or {}).get("speedup_vs_baseline")),
            optimized_vs_reference=(median / candidate_median) if median and candidate_median else None,
        ))
    reasons = tuple(_reason_text(r) for r in workload.get("reasons") or [])
    return WorkloadRow(
        name=str(workload.get("name", "")), label=workload_label(workload),
        family=str(workload.get("family", "")), shape=shape_text(workload.get("shape")),
        dtype=str(workload.get("dtype", "")), baseline_impl=str(baseline.get("impl", "")),
        baseline_median=duration(as_number(baseline.get("median_s"))), candidate_median=duration(candidate_median),
        speedup=as_number(workload.get("speedup")), ci_low=ci[0] if ci else None, ci_high=ci[1] if ci else None,
        verdict=str(workload.get("verdict", "")), correctness_passed=correctness.get("passed"),
        max_abs_err=as_number(correctness.get("max_abs_err")), max_rel_err=as_number(correctness.get("max_rel_err")),
        atol=as_number(correctness.get("atol")), rtol=as_number(correctness.get("rtol")),
        references=tuple(references), reasons=reasons, billable=bool(billing.get("billable")),
        billable_speedup=billing.get("billable_speedup"),
        not_billable=not_billable_text(billing["reason"]) if billing.get("reason") else "",
    )


def _reason_text(reason: Any) -> str:
    if isinstance(reason, dict):
        code, text = reason.get("code", ""), reason.get("message") or reason.get("text") or ""
        return f"{code}: {text}" if code and text else str(code or text)
    return str(reason)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


# --- charts -------------------------------------------------------------------------------------


def charts(body: dict[str, Any], rows: tuple[WorkloadRow, ...]) -> dict[str, Any]:
    """Plotly figure specs (plain dicts, drawn by static/reports/report.js)."""
    result = body.get("result") or {}
    figures = {"speedup": speedup_figure(body, rows), "latency": latency_figure(result)}
    utilization = utilization_figure(result, body.get("environment") or {})
    if utilization is not None:
        figures["utilization"] = utilization
    return figures


def speedup_figure(body: dict[str, Any], rows: tuple[WorkloadRow, ...]) -> dict[str, Any]:
    labels = [r.label for r in rows]
    speedups = [r.speedup for r in rows]
    traces: list[dict[str, Any]] = [{
        "type": "bar", "name": "optimized vs eager baseline", "x": labels, "y": speedups,
        "marker": {"color": [VERDICT_COLOURS.get(r.verdict, "#65707d") for r in rows]},
        "error_y": {"type": "data", "symmetric": False,
                    "array": [_up(r.ci_high, r.speedup) for r in rows],
                    "arrayminus": [_up(r.speedup, r.ci_low) for r in rows]},
        "hovertemplate": "%{x}<br>speedup %{y:.3f}x<extra></extra>",
    }]
    reference_names = sorted({c.name for r in rows for c in r.references})
    for name in reference_names:
        ys = [next((c.speedup_vs_baseline for c in r.references if c.name == name), None) for r in rows]
        traces.append({"type": "scatter", "mode": "markers", "name": f"{name} vs eager", "x": labels, "y": ys,
                       "marker": {"symbol": "diamond", "size": 10}})
    model = (body.get("result") or {}).get("model") or {}
    model_ci = as_interval(model.get("ci95"))
    if as_number(model.get("speedup")) is not None:
        traces.append({"type": "bar", "name": "whole model", "x": ["whole model"], "y": [model["speedup"]],
                       "marker": {"color": "#1f5fbf"},
                       "error_y": {"type": "data", "symmetric": False,
                                   "array": [_up(model_ci[1], model["speedup"]) if model_ci else 0],
                                   "arrayminus": [_up(model["speedup"], model_ci[0]) if model_ci else 0]}})
    return {"data": traces, "layout": {
        "title": {"text": "Speedup over the eager baseline (bars: 95% CI)"},
        "yaxis": {"title": {"text": "speedup (x)"}, "rangemode": "tozero"},
        "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
                    "line": {"dash": "dot", "color": "#65707d"}}],
        "barmode": "group", "margin": {"b": 120}, "legend": {"orientation": "h"},
    }}


def latency_figure(result: dict[str, Any]) -> dict[str, Any]:
    traces = []
    for role, key, colour in (("eager baseline", "baseline", "#65707d"), ("optimized", "candidate", "#1f5fbf")):
        xs: list[str] = []
        ys: list[float] = []
        for workload in result.get("workloads") or []:
            samples = [s for s in ((workload.get(key) or {}).get("samples_s") or []) if as_number(s) is not None]
            xs += [workload_label(workload)] * len(samples)
            ys += [s * 1e6 for s in samples]
        traces.append({"type": "box", "name": role, "x": xs, "y": ys, "marker": {"color": colour},
                       "boxpoints": "outliers"})
    return {"data": traces, "layout": {
        "title": {"text": "Latency samples per workload (interleaved rounds)"},
        "yaxis": {"title": {"text": "latency (µs, log)"}, "type": "log"},
        "boxmode": "group", "margin": {"b": 120}, "legend": {"orientation": "h"},
    }}


def utilization_figure(result: dict[str, Any], environment: dict[str, Any]) -> dict[str, Any] | None:
    """Achieved bandwidth / FLOP/s as a share of the device's peak, where the runner measured them.

    Read from `workload.{baseline,candidate}.achieved {bandwidth_gbs, tflops}` and
    `environment.peak {bandwidth_gbs, tflops}`; absent on CPU runs, so no chart there.
    """
    peak = environment.get("peak") or {}
    traces = []
    for metric, unit in (("bandwidth_gbs", "bandwidth"), ("tflops", "FLOP/s")):
        top = as_number(peak.get(metric))
        if not top:
            continue
        for role, key in (("eager baseline", "baseline"), ("optimized", "candidate")):
            xs, ys = [], []
            for workload in result.get("workloads") or []:
                achieved = as_number(((workload.get(key) or {}).get("achieved") or {}).get(metric))
                if achieved is not None:
                    xs.append(workload_label(workload))
                    ys.append(100.0 * achieved / top)
            if xs:
                traces.append({"type": "bar", "name": f"{role}: {unit}", "x": xs, "y": ys})
    if not traces:
        return None
    return {"data": traces, "layout": {
        "title": {"text": "Achieved share of the device's peak"},
        "yaxis": {"title": {"text": "% of peak"}, "range": [0, 100]},
        "barmode": "group", "margin": {"b": 120}, "legend": {"orientation": "h"},
    }}


def speedup_svg(rows: tuple[WorkloadRow, ...], *, width: int = 680) -> str:
    """A static speedup chart for the PDF (WeasyPrint draws SVG; no JavaScript there)."""
    drawn = [r for r in rows if r.speedup is not None]
    if not drawn:
        return ""
    bar_h, gap, left, right = 16, 6, 230, 40
    top = max(max((r.ci_high or r.speedup or 0) for r in drawn), 1.0) * 1.1
    scale = (width - left - right) / top
    height = len(drawn) * (bar_h + gap) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="10">']
    for i, row in enumerate(drawn):
        y = 10 + i * (bar_h + gap)
        colour = VERDICT_COLOURS.get(row.verdict, "#65707d")
        parts.append(f'<text x="{left - 6}" y="{y + bar_h - 4}" text-anchor="end">{html.escape(row.label)}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{row.speedup * scale:.1f}" height="{bar_h}" '
                     f'fill="{colour}" opacity="0.8"/>')
        if row.ci_low is not None and row.ci_high is not None:
            mid = y + bar_h / 2
            parts.append(f'<line x1="{left + row.ci_low * scale:.1f}" x2="{left + row.ci_high * scale:.1f}" '
                         f'y1="{mid}" y2="{mid}" stroke="#000" stroke-width="1.5"/>')
        parts.append(f'<text x="{left + (row.ci_high or row.speedup) * scale + 4:.1f}" y="{y + bar_h - 4}">'
                     f'{row.speedup:.2f}x</text>')
    one = left + scale
    parts.append(f'<line x1="{one:.1f}" x2="{one:.1f}" y1="4" y2="{height - 18}" stroke="#65707d" '
                 'stroke-dasharray="3,3"/>')
    parts.append(f'<text x="{one:.1f}" y="{height - 6}" text-anchor="middle">1.0x (eager baseline)</text>')
    parts.append("</svg>")
    return "".join(parts)


# --- small helpers ------------------------------------------------------------------------------


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    return "—" if value is None else str(value)


def _sci(value: float | None) -> str:
    # Errors and tolerances span 1e-8..1e-1: scientific notation keeps them comparable at a glance.
    return "—" if value is None else f"{value:.2g}"


def _up(high: float | None, low: float | None) -> float:
    return max(0.0, high - low) if high is not None and low is not None else 0.0

