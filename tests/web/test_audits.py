"""Bring your own kernel: submitted candidates are audited by a real worker in the harness sandbox."""

from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from accounts.selectors import Actor
from runs.models import Run
from runs.services import RunRejected, audit_start

from ..conftest import wait_for

CHEATS = Path(__file__).resolve().parents[1] / "runners" / "cheats"
HONEST = "import torch\n\ndef kernel(x, weight):\n    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)\n"


@pytest.mark.django_db
@pytest.mark.parametrize("source, message", [
    ("", "empty"),
    ("def kernel(:\n", "not valid Python"),
    ("def not_kernel(x):\n    return x\n", "no top-level `kernel`"),
    ("x = 1\n" * 60000, "KiB"),
])
def test_it_refuses_what_cannot_be_a_candidate(make_org, source, message):
    org = make_org()
    with pytest.raises(RunRejected, match=message):
        audit_start(actor=Actor(roles={org.pk: "owner"}), organization_id=org.pk, workload="rmsnorm",
                    source=source, hardware="cpu")
    assert Run.objects.count() == 0


@pytest.mark.django_db
def test_it_refuses_an_unknown_workload(make_org):
    org = make_org()
    with pytest.raises(RunRejected, match="not in the suite"):
        audit_start(actor=Actor(roles={org.pk: "owner"}), organization_id=org.pk, workload="fft",
                    source=HONEST, hardware="cpu")


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_it_judges_submitted_kernels_and_survives_a_crashing_one(client, make_org, make_key, start_worker):
    org = make_org()
    raw = make_key(org)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    start_worker()

    def submit(workload: str, source: str) -> str:
        upload = SimpleUploadedFile("candidate.py", source.encode())
        response = client.post("/api/v1/audits", {"workload": workload, "hardware": "cpu", "candidate": upload}, **auth)
        assert response.status_code == 201, response.content
        return response.json()["id"]

    cheat = submit("softmax", (CHEATS / "return_input.py").read_text())
    # A hang ends the same way after the protocol's first-call timeout (300 s by default; the
    # harness's own tests cover it with short timeouts); a crash shows it here without the wait.
    crash = submit("rmsnorm", (CHEATS / "segfault.py").read_text())
    honest = submit("rmsnorm", HONEST)

    def finished(run_id: str) -> bool:
        return Run.objects.get(pk=run_id).finished

    wait_for(lambda: all(finished(r) for r in (cheat, crash, honest)), timeout=240, interval=1, what="three audits")
    runs = {name: Run.objects.get(pk=run_id) for name, run_id in
            (("cheat", cheat), ("crash", crash), ("honest", honest))}
    assert all(run.status == "succeeded" for run in runs.values()), {k: v.error for k, v in runs.items()}
    assert runs["cheat"].verdict == "rejected"
    codes = {r["code"] for w in runs["cheat"].result["workloads"] for r in w["reasons"]}
    assert "integrity.output_aliases_input" in codes
    assert runs["crash"].verdict == "error"
    assert "sandbox.crash" in {r["code"] for w in runs["crash"].result["workloads"] for r in w["reasons"]}
    # The worker lived on and judged the next job honestly.
    assert runs["honest"].verdict == "accepted"
    detail = client.get(f"/api/v1/audits/{honest}", **auth).json()
    assert detail["workloads"][0]["verdict"] == "accepted" and detail["candidate_sha256"]
    # Every finished audit gets a signed report (made on the control queue), verifiable offline.
    from reports.models import Report
    from reports.selectors import report_verify

    report = wait_for(lambda: Report.objects.filter(run_id=honest).first(), timeout=60, what="the report")
    assert report.kind == "audit" and report_verify(report=report).valid
