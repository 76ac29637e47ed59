"""Schemathesis against a live server with the API's own OpenAPI document: requests generated from
every operation's schema (examples, boundary and invalid values, then random ones), each answer
checked for a server error, a status code the document declares for the operation, a body that
matches the declared schema and the declared content type.

Three passes over billed data (an organization with models, runs, signed reports, a contract,
deployments and invoices), with real identifiers in every path so that requests reach the
handlers instead of a 404: the customer's key over every operation, finance's key over the billing
operations and an auditor's over the reports (re-audit requests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance"
FINANCE_PATHS = "^/(invoices|billing-runs|exports|contracts)"
AUDITOR_PATHS = "^/reports"


def _schemathesis() -> str:
    found = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or shutil.which("schemathesis")
    assert found, "schemathesis is a test dependency (pyproject's test extra): make install"
    return found


def _config(path: Path, identifiers: dict[str, str], billing_run: str) -> Path:
    # Unexpected methods (405 with a JSON body and Allow) are tested in tests/web/test_hostile_input.py;
    # sending every other method to every operation would double this test's time.
    lines = ["[phases.coverage]", "unexpected-methods = []", "",
             "[parameters]", *(f'{name} = "{value}"' for name, value in identifiers.items()),
             "", "[[operations]]", 'include-path-regex = "^/billing-runs/"', f'parameters = {{ run_id = "{billing_run}" }}', ""]
    path.write_text("\n".join(lines))
    return path


def _fuzz(url: str, key: str, config: Path, report: Path, *extra: str) -> subprocess.Popen[str]:
    report.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [_schemathesis(), "--config-file", str(config), "run", f"{url}/api/v1/openapi.json", "--checks", CHECKS,
         "--header", f"Authorization: Bearer {key}", "--phases", "examples,coverage,fuzzing", "--max-examples", "5",
         "--seed", "1", "--workers", "1", "--request-timeout", "20", "--no-color", "--report-dir", str(report),
         "--report", "junit", *extra],
        cwd=report, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,  # its cache lands there, not in the tree
    )


@pytest.fixture
def api(transactional_db, live_server, billed, make_key, operator_org, settings, tmp_path, monkeypatch):
    from metering.models import BillingRun, Contract, Deployment
    from reports.models import Report

    settings.DYNO_SIGNING_KEY_PATH = str(tmp_path / "keys" / "report-signing.pem")
    settings.MEDIA_ROOT = str(tmp_path / "media")
    settings.DYNO_THROTTLE_BAD_KEYS = 1_000_000  # generated requests send many wrong keys; throttling is tested elsewhere
    monkeypatch.setattr("runs.services.run_enqueue", lambda run: None)  # no runner behind this server
    monkeypatch.setattr("dyno.dispatch.send", lambda *args, **kwargs: None)  # nor a control worker
    invoice = billed["acme"]
    org = invoice.organization
    report = Report.objects.filter(organization=org).select_related("run__model_version").first()
    identifiers = {
        "model_id": str(report.run.model_version.model_id), "version_id": str(report.run.model_version_id),
        "run_id": str(report.run_id), "report_id": str(report.pk), "invoice_id": str(invoice.pk),
        "deployment_id": str(Deployment.objects.filter(organization=org).first().pk),
        "contract_id": str(Contract.objects.filter(organization=org).first().pk),
    }
    config = _config(tmp_path / "schemathesis.toml", identifiers, str(BillingRun.objects.first().pk))
    return live_server.url, make_key(org), make_key(operator_org, scope="finance"), make_key(org, scope="auditor"), config


@pytest.mark.slow
def test_every_generated_request_gets_an_answer_its_document_declares(api, tmp_path):
    url, customer, finance, auditor, config = api
    # Customers get 403 from the billing runs and the revenue-share export: finance's pass covers them.
    # The three passes run at once (the live server answers each request on its own thread): the
    # generation is schemathesis's CPU, and one after the other they took 106 s here.
    passes = {who: _fuzz(url, key, config, tmp_path / who, *extra) for who, key, extra in (
        ("customer", customer, ("--exclude-path-regex", "^/(billing-runs|exports)")),
        ("finance", finance, ("--include-path-regex", FINANCE_PATHS)),
        ("auditor", auditor, ("--include-path-regex", AUDITOR_PATHS)))}
    for who, proc in passes.items():
        try:
            stdout, stderr = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for other in passes.values():
                other.kill()
            raise
        assert proc.returncode == 0, f"{who}:\n" + stdout[-12000:] + stderr[-3000:]
        assert "generated" in stdout and " 0 passed" not in stdout
