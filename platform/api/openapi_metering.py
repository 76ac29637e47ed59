"""The metering part of the OpenAPI document for /api/v1/: paths and schemas, which api/openapi.py
merges (one home for the document; the shared blocks are api/openapi_parts.py)."""

from __future__ import annotations

from typing import Any

from api.openapi_parts import errors as _errors, id_param as _id_param, json_response as _json
from api.openapi_parts import page_parameters, page_schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _list(key: str, schema: str) -> dict[str, Any]:
    """One page of a list (newest first, `limit` and `cursor`: page_parameters())."""
    return page_schema(key, _ref(schema))


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


MONEY = {"type": "string", "pattern": r"^-?\d+(\.\d+)?$", "description": "a decimal string, never a float"}
PERIOD = {"type": "string", "pattern": r"^\d{4}-\d{2}$", "examples": ["2026-11"]}
FINANCE = " Finance keys of the billing operator's organization only."


def metering_paths() -> dict[str, Any]:
    invoice_id = _id_param("invoice_id")
    return {
        "/contracts": {
            "get": {"summary": "Contract versions you may read (a customer: its own), newest first",
                    "parameters": [{"name": "organization", "in": "query", "schema": {"type": "string"}},
                                   *page_parameters()],
                    "responses": {"200": _json(_list("contracts", "Contract"), "contracts"),
                                  **_errors(400, 401, 403)}},
            "post": {"summary": "Add a contract version from the first day of a month." + FINANCE,
                     "requestBody": _body(_ref("ContractRequest")),
                     "responses": {"201": _json(_ref("Contract"), "the new version"),
                                   **_errors(400, 401, 403, 404, 409)}},
        },
        "/contracts/{contract_id}": {"get": {"summary": "One contract version", "parameters": [
            _id_param("contract_id")], "responses": {"200": _json(_ref("Contract"), "contract"), **_errors(401, 404)}}},
        "/deployments": {
            "get": {"summary": "Your deployments with their report history, newest first",
                    "parameters": page_parameters(),
                    "responses": {"200": _json(_list("deployments", "Deployment"), "deployments"),
                                  **_errors(400, 401)}},
            "post": {"summary": "Deploy the artifact a signed report measured (customer keys)",
                     "requestBody": _body({"type": "object", "required": ["report", "name"], "properties": {
                         "report": {"type": "string", "format": "uuid"}, "name": {"type": "string"},
                         "active_from": {"type": "string", "format": "date-time"}}}),
                     "responses": {"201": _json(_ref("Deployment"), "the deployment"),
                                   **_errors(400, 401, 403, 404, 409)}},
        },
        "/deployments/{deployment_id}": {"get": {"summary": "A deployment", "parameters": [
            _id_param("deployment_id")], "responses": {"200": _json(_ref("Deployment"), "deployment"),
                                                       **_errors(401, 404)}}},
        "/deployments/{deployment_id}/reports": {"post": {
            "summary": "Correct a deployment's report by hand (billing operator's finance key only, with a reason; "
                       "a re-audit's report takes over by itself). Same artifact, stable, on the contract's plan; "
                       "never inside a billed month",
            "parameters": [_id_param("deployment_id")],
            "requestBody": _body({"type": "object", "required": ["report", "reason"], "properties": {
                "report": {"type": "string", "format": "uuid"},
                "reason": {"type": "string", "minLength": 1},
                "effective_from": {"type": "string", "format": "date-time"}}}),
            "responses": {"201": _json(_ref("Deployment"), "deployment"), **_errors(400, 401, 403, 404, 409)}}},
        "/usage/batch": {"post": {
            "summary": "Report up to 1,000 usage events; each gets created, duplicate or rejected with a reason",
            "requestBody": _body({"type": "object", "required": ["events"], "properties": {"events": {
                "type": "array", "minItems": 1, "maxItems": 1000, "items": _ref("UsageEvent")}}}),
            "responses": {"200": _json(_ref("UsageBatchResult"), "one result per event, in order"),
                          **_errors(400, 401, 403)}}},
        "/billing-runs": {
            "get": {"summary": "Billing runs, newest first." + FINANCE, "parameters": page_parameters(),
                    "responses": {"200": _json(_list("billing_runs", "BillingRun"), "runs"),
                                  **_errors(400, 401, 403)}},
            "post": {"summary": "Bill a month once (a rerun returns the existing run, 200)." + FINANCE,
                     "requestBody": _body({"type": "object", "required": ["period"], "properties": {"period": PERIOD}}),
                     "responses": {"201": _json(_ref("BillingRun"), "the run"), "200": _json(_ref("BillingRun"),
                                                                                        "the run that existed"),
                                   **_errors(400, 401, 403, 409)}},
        },
        "/billing-runs/{run_id}": {"get": {"summary": "A billing run." + FINANCE, "parameters": [_id_param("run_id")],
                                           "responses": {"200": _json(_ref("BillingRun"), "run"),
                                                         **_errors(401, 403, 404)}}},
        "/invoices": {"get": {"summary": "Invoices you may read (a customer: its own, once finalized), newest first",
                              "parameters": [*({"name": n, "in": "query", "schema": s} for n, s in (
                                  ("status", {"enum": ["draft", "finalized", "void"]}), ("period", PERIOD),
                                  ("organization", {"type": "string"}), ("currency", {"type": "string"}))),
                                  *page_parameters()],
                              "responses": {"200": _json(_list("invoices", "Invoice"), "invoices"),
                                            **_errors(400, 401)}}},
        "/invoices/{invoice_id}": {"get": {"summary": "An invoice with its lines, billing records and credit notes",
                                           "parameters": [invoice_id],
                                           "responses": {"200": _json(_ref("Invoice"), "invoice"),
                                                         **_errors(401, 404)}}},
        "/invoices/{invoice_id}/finalize": {"post": {
            "summary": "Draft -> finalized, with the next gapless number of the year." + FINANCE,
            "parameters": [invoice_id], "responses": {"200": _json(_ref("Invoice"), "invoice"),
                                                      **_errors(401, 403, 404, 409)}}},
        "/invoices/{invoice_id}/void": {"post": {
            "summary": "Finalized -> void, with a reason." + FINANCE, "parameters": [invoice_id],
            "requestBody": _body({"type": "object", "required": ["reason"], "properties": {
                "reason": {"type": "string"}}}),
            "responses": {"200": _json(_ref("Invoice"), "invoice"), **_errors(400, 401, 403, 404, 409)}}},
        "/invoices/{invoice_id}/reissue": {"post": {
            "summary": "Void a finalized invoice (reason required) or take a void one whose usage is not billed "
                       "again yet, and bill that usage at once on a corrective invoice with the next number."
                       + FINANCE, "parameters": [invoice_id],
            "requestBody": _body({"type": "object", "properties": {"reason": {"type": "string"}}}),
            "responses": {"201": _json(_ref("Invoice"), "the corrective invoice"),
                          **_errors(400, 401, 403, 404, 409)}}},
        "/invoices/{invoice_id}/credit-notes": {
            "get": {"summary": "Credit notes of an invoice, newest first",
                    "parameters": [invoice_id, *page_parameters()],
                    "responses": {"200": _json(_list("credit_notes", "CreditNote"), "credit notes"),
                                  **_errors(400, 401, 404)}},
            "post": {"summary": "Credit a finalized invoice in full or per line." + FINANCE, "parameters": [invoice_id],
                     "requestBody": _body({"type": "object", "required": ["reason_code"], "properties": {
                         "reason_code": {"enum": ["billing_error", "report_dispute", "service_credit", "duplicate",
                                                  "goodwill"]},
                         "memo": {"type": "string"}, "full": {"type": "boolean"},
                         "lines": {"type": "object", "additionalProperties": MONEY,
                                   "description": "invoice line id -> amount"}}}),
                     "responses": {"201": _json(_ref("CreditNote"), "the credit note"),
                                   **_errors(400, 401, 403, 404, 409)}},
        },
        "/invoices/{invoice_id}/export": {"get": {
            "summary": "The invoice as CSV, XLSX or PDF", "parameters": [invoice_id, {
                "name": "format", "in": "query", "schema": {"enum": ["csv", "xlsx", "pdf"], "default": "csv"}}],
            "responses": {"200": {"description": "the file (Content-Disposition: attachment)"},
                          **_errors(400, 401, 404)}}},
        "/exports/revenue-share": {"get": {
            "summary": "A period's revenue-share summary as CSV or XLSX." + FINANCE, "parameters": [
                {"name": "period", "in": "query", "required": True, "schema": PERIOD},
                {"name": "format", "in": "query", "schema": {"enum": ["csv", "xlsx"], "default": "csv"}}],
            "responses": {"200": {"description": "the file"}, **_errors(400, 401, 403)}}},
        "/invoices/preview": {"get": {
            "summary": "What the open month would be invoiced if it ended now, by the billing run's own rules "
                       "(lines with the speedup S used, hours and fee; the cap; the total). Stores nothing. A "
                       "customer's key sees its own organization; the billing operator's finance keys see every "
                       "organization, or one with ?organization",
            "parameters": [{"name": "organization", "in": "query", "schema": {"type": "string"},
                            "description": "slug; another organization than a customer key's own is a 404"}],
            "responses": {"200": _json(_ref("InvoicePreview"), "the upcoming invoices"),
                          **_errors(401, 403, 404, 409)}}},
    }


def metering_schemas() -> dict[str, Any]:
    uuid = {"type": "string", "format": "uuid"}
    return {
        "ContractRequest": {"type": "object", "required": ["organization", "effective_from", "revenue_share", "prices",
                                                           "minimum_speedup", "measurement_plan"], "properties": {
            "organization": {"type": "string", "description": "slug"},
            "effective_from": {"type": "string", "format": "date", "description": "the first day of a month"},
            "revenue_share": MONEY, "prices": {"type": "object", "additionalProperties": MONEY,
                                               "examples": [{"gpu-h100": "2.50"}]},
            "minimum_speedup": MONEY, "monthly_cap": {**MONEY, "type": ["string", "null"]},
            "currency": {"type": "string", "default": "EUR"},
            "rounding": {"enum": ["half_even", "half_up", "half_down", "up", "down", "ceiling", "floor"],
                         "default": "half_even"},
            "dispute_window_days": {"type": "integer", "default": 30},
            "measurement_plan": {"type": "object", "required": ["suite_version", "baseline"], "properties": {
                "suite_version": {"type": "string"},
                "suite_manifest_sha256": {"type": ["string", "null"], "description": "null: any manifest of the suite version"},
                "baseline": {"type": "string"}}}}},
        "Contract": {"allOf": [_ref("ContractRequest"), {"type": "object", "properties": {
            "id": uuid, "version": {"type": "integer"},
            "effective_to": {"type": ["string", "null"], "format": "date"}}}]},
        "Deployment": {"type": "object", "properties": {
            "id": uuid, "name": {"type": "string"}, "organization": {"type": "string"}, "model_version": uuid,
            "hardware": {"type": "string"}, "artifact_sha256": {"type": ["string", "null"]},
            "active_from": {"type": "string", "format": "date-time"},
            "reports": {"type": "array", "items": {"type": "object", "properties": {
                "report": uuid, "report_sha256": {"type": "string"}, "ci_low": MONEY, "stable": {"type": "boolean"},
                "effective_from": {"type": "string", "format": "date-time"}}}}}},
        "UsageEvent": {"type": "object", "required": ["idempotency_key", "deployment", "timestamp", "gpu_hours"],
                       "properties": {
                           "idempotency_key": {"type": "string", "maxLength": 200}, "deployment": uuid,
                           "timestamp": {"type": "string", "format": "date-time",
                                         "description": "at most 35 days back, 5 minutes ahead"},
                           "gpu_hours": {**MONEY, "description": "positive, at most 6 decimal places"}}},
        "UsageBatchResult": {"type": "object", "properties": {
            "created": {"type": "integer"}, "duplicate": {"type": "integer"}, "rejected": {"type": "integer"},
            "results": {"type": "array", "items": {"type": "object", "properties": {
                "idempotency_key": {"type": ["string", "null"]},
                "status": {"enum": ["created", "duplicate", "rejected"]},
                "reason": {"type": "object", "properties": {"code": {"type": "string"},
                                                            "message": {"type": "string"}}}}}}}},
        "BillingRun": {"type": "object", "properties": {
            "id": uuid, "period": PERIOD, "cutoff": {"type": "string", "format": "date-time"},
            "summary": {"type": "object"}, "created": {"type": "boolean"}}},
        "InvoiceLine": {"type": "object", "properties": {
            "id": {"type": "integer"}, "position": {"type": "integer"},
            "kind": {"enum": ["usage", "adjustment", "cap"]}, "usage_period": PERIOD,
            "description": {"type": "string"}, "hours": MONEY, "speedup": MONEY, "saved_hours": MONEY,
            "price_per_hour": MONEY, "share": MONEY, "savings": MONEY, "fee": MONEY, "credited": MONEY,
            "reason": {"type": ["string", "null"]},
            "billing_record": {"type": "object", "description": "the signed report (digest, key, signature) and "
                                                                "the exact figures the line rounds"}}},
        "Invoice": {"type": "object", "properties": {
            "id": uuid, "number": {"type": ["string", "null"]}, "organization": {"type": "string"},
            "period": PERIOD, "currency": {"type": "string"}, "status": {"enum": ["draft", "finalized", "void"]},
            "total": MONEY, "balance": MONEY, "lines": {"type": "array", "items": _ref("InvoiceLine")},
            "credit_notes": {"type": "array", "items": _ref("CreditNote")}}},
        "CreditNote": {"type": "object", "properties": {
            "id": uuid, "number": {"type": "string"}, "invoice": uuid, "reason_code": {"type": "string"},
            "memo": {"type": "string"}, "full": {"type": "boolean"}, "total": MONEY,
            "lines": {"type": "array", "items": {"type": "object", "properties": {
                "invoice_line": {"type": "integer"}, "amount": MONEY}}}}},
        "InvoicePreview": {"type": "object", "properties": {
            "period": PERIOD, "as_of": {"type": "string", "format": "date-time",
                                        "description": "usage received before this moment is counted"},
            "previous_run": {**PERIOD, "type": ["string", "null"],
                             "description": "the billed month whose run this one follows; null while the "
                                            "previous month is unbilled (its run takes all earlier usage)"},
            "invoices": {"type": "array", "items": {"type": "object", "properties": {
                "organization": {"type": "string"}, "currency": {"type": "string"},
                "monthly_cap": {**MONEY, "type": ["string", "null"]},
                "cap_applied": {**MONEY, "description": "the cap lines' sum, zero or negative"}, "total": MONEY,
                "lines": {"type": "array", "items": _ref("PreviewLine")}}}},
            "unbilled": {"type": "array", "items": {"type": "object", "properties": {
                "deployment": uuid, "usage_period": PERIOD, "hours": MONEY,
                "reason": {"enum": ["no_contract", "hardware_not_priced"]}}}}}},
        "PreviewLine": {"type": "object", "properties": {
            "position": {"type": "integer"}, "kind": {"enum": ["usage", "adjustment", "cap"]},
            "usage_period": PERIOD, "description": {"type": "string"},
            "deployment": {**uuid, "type": ["string", "null"]}, "deployment_name": {"type": ["string", "null"]},
            "hardware": {"type": ["string", "null"]}, "report": {**uuid, "type": ["string", "null"]},
            "report_sha256": {"type": ["string", "null"]}, "ci_low": {**MONEY, "type": ["string", "null"]},
            "speedup": {**MONEY, "description": "S billed: the report's CI lower bound, or 1 with a reason"},
            "hours": MONEY, "saved_hours": MONEY, "price_per_hour": MONEY, "share": MONEY, "savings": MONEY,
            "fee": MONEY, "reason": {"type": ["string", "null"]}}},
    }
