"""The revenue dashboard (finance: by month, customer and hardware class) and the savings
dashboard (a customer: savings, fees and saved hours by month and deployment) as plotly figures,
over finalized invoices only (drafts are not revenue yet, void ones never are). Revenue is
selectors.revenue_lines, net of credit notes, as in the revenue-share export and the invoice list.

Charts draw floats, so amounts become floats here and only here; the tables beside the charts
show the exact decimals.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import plotly.graph_objects as go
from django.db.models import Sum

from metering.models import BillingRecord, InvoiceStatus
from metering.periods import Period
from metering.selectors import BillingAccess, revenue_lines, revenue_totals

LAYOUT = {"margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "height": 340, "barmode": "relative",
          "legend": {"orientation": "h"}, "font": {"family": "system-ui, sans-serif", "size": 12}}


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    figure: dict[str, Any]  # plain JSON: what Plotly.newPlot takes


def _chart(chart_id: str, title: str, traces: list[go.BaseTraceType], **layout: Any) -> Chart:
    figure = go.Figure(data=traces, layout={**LAYOUT, "title": {"text": title}, **layout})
    return Chart(id=chart_id, title=title, figure=json.loads(figure.to_json()))


def _float(value: Decimal | None) -> float:
    return float(value or 0)


def revenue_by_month(access: BillingAccess) -> tuple[Chart, list[dict[str, Any]]]:
    table = [{**row, "period": Period.of(row["invoice__period"]).name}
             for row in revenue_totals(revenue_lines(access=access), "invoice__period")]
    traces = []
    for currency in sorted({row["currency"] for row in table}):
        rows = [row for row in table if row["currency"] == currency]
        traces.append(go.Bar(name=f"invoiced {currency}", x=[r["period"] for r in rows],
                             y=[_float(r["invoiced"]) for r in rows]))
        traces.append(go.Bar(name=f"credited {currency}", x=[r["period"] for r in rows],
                             y=[-_float(r["credited"]) for r in rows]))
    return _chart("revenue-by-month", "Revenue by month: finalized invoices, less credit notes", traces,
                  xaxis={"type": "category"}), table


def revenue_by_customer(access: BillingAccess, *, top: int = 15) -> tuple[Chart, list[dict[str, Any]]]:
    rows = sorted(revenue_totals(revenue_lines(access=access), "invoice__organization__slug"),
                  key=lambda row: (-row["net"], row["invoice__organization__slug"]))[:top]
    traces = []
    for currency in sorted({row["currency"] for row in rows}):
        mine = [row for row in rows if row["currency"] == currency][::-1]
        traces.append(go.Bar(name=currency, orientation="h", y=[r["invoice__organization__slug"] for r in mine],
                             x=[_float(r["net"]) for r in mine]))
    table = [{"organization": r["invoice__organization__slug"], **r} for r in rows]
    return _chart("revenue-by-customer", f"Net revenue by customer (top {top})", traces), table


def revenue_by_hardware(access: BillingAccess) -> tuple[Chart, list[dict[str, Any]]]:
    rows = revenue_totals(revenue_lines(access=access), "invoice__period", "record__hardware")
    series: dict[tuple[str, str], dict[str, Decimal]] = defaultdict(dict)
    table = []
    for row in rows:
        # Cap lines carry no record: they show as their own (negative) class.
        hardware = row["record__hardware"] or "monthly cap"
        period = Period.of(row["invoice__period"]).name
        series[(hardware, row["currency"])][period] = row["net"]
        table.append({**row, "period": period, "hardware": hardware})
    traces = [go.Bar(name=f"{hardware} ({currency})", x=list(points), y=[_float(v) for v in points.values()])
              for (hardware, currency), points in sorted(series.items())]
    return _chart("revenue-by-hardware", "Net revenue by hardware class (caps as their own class)", traces,
                  xaxis={"type": "category"}, barmode="relative"), table


def savings_by_month(org_ids: frozenset[int]) -> tuple[list[Chart], list[dict[str, Any]]]:
    """A customer's view: what the optimization saved, and what it cost, month by month."""
    rows = list(BillingRecord.objects.filter(organization_id__in=org_ids,
                                             line__invoice__status=InvoiceStatus.FINALIZED)
                .values("usage_period", "currency")
                .annotate(hours=Sum("hours"), saved=Sum("saved_hours"), savings=Sum("savings"), fees=Sum("fee"))
                .order_by("usage_period"))
    table = [{"period": Period.of(r["usage_period"]).name, "currency": r["currency"], "hours": r["hours"],
              "saved_hours": r["saved"], "savings": r["savings"], "fees": r["fees"],
              "kept": r["savings"] - r["fees"]} for r in rows]
    money_traces = []
    for currency in sorted({row["currency"] for row in table}):
        mine = [row for row in table if row["currency"] == currency]
        x = [row["period"] for row in mine]
        money_traces += [go.Bar(name=f"you keep ({currency})", x=x, y=[_float(r["kept"]) for r in mine]),
                         go.Bar(name=f"fees ({currency})", x=x, y=[_float(r["fees"]) for r in mine])]
    by_deployment = list(BillingRecord.objects.filter(organization_id__in=org_ids,
                                                      line__invoice__status=InvoiceStatus.FINALIZED)
                         .values("usage_period", "deployment__name").annotate(saved=Sum("saved_hours"))
                         .order_by("usage_period"))
    series: dict[str, dict[str, Decimal]] = defaultdict(dict)
    for row in by_deployment:
        series[row["deployment__name"]][Period.of(row["usage_period"]).name] = row["saved"]
    hour_traces = [go.Bar(name=name, x=list(points), y=[_float(v) for v in points.values()])
                   for name, points in sorted(series.items())]
    charts = [
        _chart("savings-by-month", "Savings by month: what you keep and the fee", money_traces,
               xaxis={"type": "category"}, barmode="stack"),
        _chart("saved-hours", "GPU-hours saved by deployment", hour_traces, xaxis={"type": "category"},
               barmode="stack"),
    ]
    return charts, table
