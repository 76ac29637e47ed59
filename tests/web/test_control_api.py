"""The control API: what a runner host, which holds no database credentials, may ask of the platform
with its runner key, and what it may not."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from accounts.selectors import Actor
from fleet.control_client import ControlClient, ControlRefused, ControlUnavailable, RunNotHeld
from fleet.keys import runner_key_create, runner_key_revoke
from reports.document import runner_calibrated
from runs.models import Run
from runs.services import audit_start, run_cancel
from runs.status import Status

from .helpers import upload_version

ROOT = Path(__file__).resolve().parents[2]
HONEST = "import torch\n\ndef kernel(x, weight):\n    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=1e-6)\n"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner(make_org):
    org = make_org()
    return org, Actor(roles={org.pk: "owner"})


@pytest.fixture
def queued(owner, django_capture_on_commit_callbacks):
    org, actor = owner

    def make(hardware: str = "cpu") -> Run:
        with django_capture_on_commit_callbacks(execute=False):  # no broker message: this test is the runner
            return audit_start(actor=actor, organization_id=org.pk, workload="rmsnorm", source=HONEST, hardware=hardware)

    return make


def test_it_refuses_a_request_without_a_live_runner_key(live_server, queued):
    run = queued()
    for token in ("", "dyno_runner_not-a-key", "Basic x"):
        with pytest.raises(ControlRefused) as refused:
            ControlClient(live_server.url, token, attempts=0).claim(str(run.pk), worker="w@host")
        assert refused.value.status == 401 and "runner key" in refused.value.message
    key, token = runner_key_create(name="gpu-pool", hardware=["cpu"])
    assert key.token_sha256 == hashlib.sha256(token.encode()).hexdigest() and token not in json.dumps(key.hardware)
    assert runner_key_revoke(name="gpu-pool")
    with pytest.raises(ControlRefused) as refused:
        ControlClient(live_server.url, token, attempts=0).claim(str(run.pk), worker="w@host")
    assert refused.value.status == 401
    assert Run.objects.get(pk=run.pk).status == Status.QUEUED  # nothing moved


def test_a_key_reaches_only_the_runs_of_its_hardware_classes(live_server, queued):
    run = queued("gpu-h100")
    _, token = runner_key_create(name="cpu-only", hardware=["cpu"])
    client = ControlClient(live_server.url, token, attempts=0)
    with pytest.raises(ControlRefused) as refused:
        client.claim(str(run.pk), worker="w@host")
    assert refused.value.status == 404  # as if it did not exist
    with pytest.raises(ControlRefused) as refused:
        client.register(hostname="gpu0@host", queues=["gpu-h100"], fingerprint={})
    assert refused.value.status == 403 and "does not serve gpu-h100" in refused.value.message


def _registered(client: ControlClient, *names: str) -> None:
    for name in names:
        client.register(hostname=name, queues=["cpu"], fingerprint={"device": "cpu"})


def test_a_key_speaks_only_for_the_workers_it_registered(live_server, queued, runner_token):
    from fleet.models import Runner

    run = queued()
    ours = ControlClient(live_server.url, runner_token, attempts=0)
    _, other_token = runner_key_create(name="other-pool", hardware=["cpu"])
    other = ControlClient(live_server.url, other_token, attempts=0)
    with pytest.raises(ControlRefused) as refused:
        ours.claim(str(run.pk), worker="w1@host")  # never registered
    assert refused.value.status == 403 and refused.value.code == "not_registered"
    _registered(ours, "w1@host")
    ours.claim(str(run.pk), worker="w1@host")
    # Another pool's key (a host that fell, say) cannot take over w1, fail its run or speak for it.
    with pytest.raises(ControlRefused) as refused:
        _registered(other, "w1@host")
    assert refused.value.code == "registered_elsewhere"
    for attempt in (lambda: other.fail(str(run.pk), worker="w1@host", error="x"),
                    lambda: other.fail(str(run.pk), worker="w1@host", error="x", outside="worker_lost"),
                    lambda: other.progress(str(run.pk), worker="w1@host", fraction=0.9),
                    lambda: other.heartbeat(hostname="w1@host", executing=[])):
        with pytest.raises(ControlRefused) as refused:
            attempt()
        assert refused.value.status == 403
    run.refresh_from_db()
    assert run.status == Status.RUNNING and run.worker == "w1@host"
    assert Runner.objects.get(hostname="w1@host").key.name != "other-pool"
    # Once its key is revoked, the name may register under another.
    runner_key_revoke(name=Runner.objects.get(hostname="w1@host").key.name)
    _registered(other, "w1@host")
    assert Runner.objects.get(hostname="w1@host").key.name == "other-pool"


def test_a_claim_hands_the_job_once_and_a_cancelled_run_stops_its_worker(live_server, queued, owner, runner_token):
    run = queued()
    client = ControlClient(live_server.url, runner_token, attempts=0)
    _registered(client, "w1@host", "w2@host")
    claim = client.claim(str(run.pk), worker="w1@host")
    assert claim["job"] == {"run_id": str(run.pk), "kind": "audit", "hardware": "cpu", "profile": run.profile,
                            "workload": "rmsnorm", "candidate_source": HONEST}
    # A claim that landed but whose answer was lost, asked again; a plain second claim (a stale
    # message of a run the worker holds) and another worker's (a duplicate delivery) are refused.
    assert client.claim(str(run.pk), worker="w1@host", again=True)["job"]["run_id"] == str(run.pk)
    for worker in ("w1@host", "w2@host"):
        with pytest.raises(RunNotHeld):
            client.claim(str(run.pk), worker=worker)
    with pytest.raises(RunNotHeld):
        client.claim(str(run.pk), worker="w2@host", again=True)
    client.progress(str(run.pk), worker="w1@host", fraction=0.5, message="halfway", stage="audit")
    assert Run.objects.get(pk=run.pk).progress == 0.5
    run_cancel(actor=owner[1], run=Run.objects.get(pk=run.pk))
    with pytest.raises(RunNotHeld):
        client.progress(str(run.pk), worker="w1@host", fraction=0.6)
    client.log(str(run.pk), worker="w1@host", message="stopped: the run was cancelled", level="warning")
    assert not client.succeed(str(run.pk), worker="w1@host", result={"verdict": "accepted"})
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.result is None


def test_an_outcome_is_stored_once_with_the_runners_calibration(live_server, queued, runner_token):
    from fleet.models import Runner

    run = queued()
    client = ControlClient(live_server.url, runner_token, attempts=0)
    assert client.register(hostname="w1@host", queues=["cpu"], fingerprint={"device": "cpu"})["hardware"] == "cpu"
    # A verdict of "billable" is taken only over rows that say so (the runner's word alone is not).
    client.calibration(hostname="w1@host", calibration={"profile": "cpu-ci", "verdict": {"billable": True, "message": "ok"}})
    runner = Runner.objects.get(hostname="w1@host")
    assert runner.calibration_billable is False and "holds no workload rows" in runner.calibration_message
    rows = [{"key": "rmsnorm", "stable": True, "baseline_verdict": "accepted"},
            {"key": "softmax", "stable": False, "baseline_verdict": "accepted"}]
    client.calibration(hostname="w1@host", calibration={"profile": "cpu-ci", "workloads": rows,
                                                        "verdict": {"billable": True, "message": "ok"}})
    assert Runner.objects.get(hostname="w1@host").calibration_billable is False
    client.calibration(hostname="w1@host", calibration={"profile": "cpu-ci", "workloads": rows[:1],
                                                        "verdict": {"billable": True, "message": "ok"}})
    assert Runner.objects.get(hostname="w1@host").calibration_billable is True
    claim = client.claim(str(run.pk), worker="w1@host")
    assert claim["registered_fingerprint_sha256"] == Runner.objects.get(hostname="w1@host").fingerprint_sha256
    result = {"schema": "dyno.suite-result/1", "verdict": "accepted", "workloads": []}
    assert client.succeed(str(run.pk), worker="w1@host", result=result)
    assert not client.succeed(str(run.pk), worker="w1@host", result=result)  # a retried store changes nothing
    run.refresh_from_db()
    assert run.status == Status.SUCCEEDED and run.events.filter(message="succeeded").count() == 1
    assert run.result["environment"]["runner_calibration"]["billable"] is True
    # A calibration belongs to one start: the runner registering again (a restart) holds none.
    client.register(hostname="w1@host", queues=["cpu"], fingerprint={"device": "cpu"})
    assert Runner.objects.get(hostname="w1@host").calibration_billable is None
    with pytest.raises(ControlRefused) as refused:
        client.request(f"runs/{run.pk}/succeed", {"worker": "w1@host", "result": [1, 2]})
    assert refused.value.status == 400 and "`result` must be a JSON object" in refused.value.message


def test_what_decides_billing_is_the_platforms_not_the_runners_document(live_server, queued, runner_token, settings):
    # Red team 16 (2026-12-06): a runner's result that said its incomplete sandbox was allowed
    # billed, and a calibration the runner wrote itself was kept for a worker with none stored.
    run = queued()
    client = ControlClient(live_server.url, runner_token, attempts=0)
    _registered(client, "w1@host")
    client.claim(str(run.pk), worker="w1@host")
    result = {"schema": "dyno.suite-result/1", "verdict": "accepted", "workloads": [],
              "sandbox": {"complete": False, "missing": ["seccomp"], "operator_allowed_incomplete": True},
              "environment": {"device": "cpu", "runner_calibration": {"billable": True, "message": "forged"}}}
    assert client.succeed(str(run.pk), worker="w1@host", result=result)
    run.refresh_from_db()
    assert run.result["sandbox"]["operator_allowed_incomplete"] is False
    assert run.result["sandbox"]["platform_refused_allowance"] is True
    # The forged block is replaced by what the platform holds: no calibration, so no billing.
    calibration = run.result["environment"]["runner_calibration"]
    assert calibration["billable"] is False and "no calibration" in calibration["message"], calibration
    assert run.result["environment"]["device"] == "cpu"
    assert runner_calibrated(run.result) is False
    # A result that does not say whether its sandbox was complete is not taken as complete.
    unsaid = queued()
    client.claim(str(unsaid.pk), worker="w1@host")
    assert client.succeed(str(unsaid.pk), worker="w1@host", result={**result, "sandbox": {"complete": "false"}})
    unsaid.refresh_from_db()
    assert unsaid.result["sandbox"]["complete"] is False and unsaid.result["sandbox"]["missing"]
    # Where the platform's operator allows it, the runner's word on its sandbox stands.
    settings.DYNO_SANDBOX_ALLOW_INCOMPLETE = True
    second = queued()
    client.claim(str(second.pk), worker="w1@host")
    assert client.succeed(str(second.pk), worker="w1@host", result=result)
    second.refresh_from_db()
    assert second.result["sandbox"]["operator_allowed_incomplete"] is True


def test_a_malformed_request_gets_a_json_refusal_not_a_server_error(client, runner_token):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {runner_token}"}
    for body, extra, code in (("{not json", {}, "invalid_json"), ("[1, 2]", {}, "invalid_json"),
                              ('{"hostname": "w"}', {"CONTENT_LENGTH": "many"}, "invalid_length"),
                              ('{"hostname": 7, "executing": []}', {}, "invalid_field")):
        answer = client.generic("POST", "/runner/v1/workers/heartbeat", body, content_type="application/json",
                                **headers, **extra)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == code, (body, answer.content)
    answer = client.get("/runner/v1/workers/heartbeat", **headers)
    assert answer.status_code == 405 and answer.json()["error"]["code"] == "method_not_allowed"


def test_malformed_values_get_a_json_refusal_and_leave_what_is_stored(live_server, queued, runner_token, client):
    # A red team's probes (2026-12-06), each a 500 as an HTML page before, one after a half-write.
    from fleet.models import Runner

    django_client = client
    run = queued()
    client = ControlClient(live_server.url, runner_token, attempts=0)
    client.register(hostname="w2@host", queues=["cpu"], fingerprint={"device": "cpu"})
    client.claim(str(run.pk), worker="w2@host")

    def refused(path: str, body: dict, code: str) -> str:
        with pytest.raises(ControlRefused) as caught:
            client.request(path, body)
        assert caught.value.status == 400 and caught.value.code == code, (path, body, caught.value.message)
        return caught.value.message

    # A calibration of another shape is refused before it is stored (it failed every later result).
    message = refused("workers/calibration", {"hostname": "w2@host", "calibration": {"verdict": "x"}}, "invalid_field")
    assert "`verdict` object" in message and Runner.objects.get(hostname="w2@host").calibration in (None, {})
    good = {"schema": "dyno.suite-result/1", "verdict": "accepted", "workloads": []}
    for result, where in (({**good, "model": {"ci95": [1.2]}}, "ci95"), ({**good, "workloads": [7]}, "workloads[0]"),
                          ({**good, "workloads": [{"name": "x" * 65}]}, "name"),
                          ({**good, "workloads": [{"name": "rmsnorm", "speedup": "fast"}]}, "speedup"),
                          ({**good, "model": {"weighting": [{"key": "a", "count": "2"}]}}, "weighting"),
                          # Red team 16: a non-object environment was a 500; a CI past what a
                          # report holds was stored, and no report could ever be made of the run.
                          ({**good, "environment": ["a"]}, "environment"),
                          ({**good, "model": {"speedup": 1.5e7, "ci95": [1e7, 2e7]}}, "between 0 and 1000000")):
        assert where in refused(f"runs/{run.pk}/succeed", {"worker": "w2@host", "result": result}, "invalid_result")
    # A NUL in any string, a NaN, a run id that is not one: refused at the door.
    assert "NUL" in refused(f"runs/{run.pk}/log", {"worker": "w2@host", "message": "a\x00b"}, "invalid_text")
    refused(f"runs/{run.pk}/succeed", {"worker": "w2@host", "result": {**good, "workloads": [{"name": "rms\x00norm"}]}},
            "invalid_text")
    answer = django_client.generic("POST", "/runner/v1/workers/register",
                                   '{"hostname": "w2@host", "queues": ["cpu"], "fingerprint": {"x": NaN}}',
                                   content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {runner_token}")
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_json", answer.content
    refused("workers/heartbeat", {"hostname": "w2@host", "executing": ["not-a-uuid"]}, "invalid_id")
    run.refresh_from_db()
    assert run.status == Status.RUNNING  # nothing of it was written
    assert client.succeed(str(run.pk), worker="w2@host", result=good)


def test_a_runner_fetches_only_the_model_files_of_the_run_it_holds(live_server, owner, runner_token, sample_models,
                                                                   media_root, tmp_path,
                                                                   django_capture_on_commit_callbacks):
    from runs.services import run_start

    org, actor = owner
    version = upload_version(org=org, folder=sample_models["llama"], actor=actor)
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(actor=actor, version=version, hardware="cpu", profile="cpu-ci", batch=1, seq=8)
    client = ControlClient(live_server.url, runner_token, attempts=0)
    _registered(client, "w1@host", "w2@host")
    files = list(version.files.values("path", "size", "sha256"))
    with pytest.raises(ControlRefused) as refused:  # not claimed yet: nobody reads it
        client.fetch_model(str(run.pk), worker="w1@host", files=files, version=str(version.pk), cache=tmp_path)
    assert refused.value.status == 404
    job = client.claim(str(run.pk), worker="w1@host")["job"]
    assert sorted(f["path"] for f in job["model_files"]) == sorted(f["path"] for f in files)
    with pytest.raises(ControlRefused):
        client.fetch_model(str(run.pk), worker="w2@host", files=files, version=str(version.pk), cache=tmp_path)
    folder = client.fetch_model(str(run.pk), worker="w1@host", files=job["model_files"], version=job["model_version"],
                                cache=tmp_path / "cache")
    for entry in files:
        assert hashlib.sha256((folder / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    for name in ("../../../etc/passwd", "%2e%2e/secret"):
        with pytest.raises(ControlRefused) as refused:
            client.request(f"runs/{run.pk}/files/{name}?worker=w1@host", read=lambda r: r.read())
        assert refused.value.status in (400, 404)
    tampered = [{**files[0], "sha256": "0" * 64}]
    with pytest.raises(ControlUnavailable, match="wrong SHA-256"):
        client.fetch_model(str(run.pk), worker="w1@host", files=tampered, version="other", cache=tmp_path / "cache")


class _Flaky(BaseHTTPRequestHandler):
    """A platform that answers 503 `failures` times, then 200 (or `status` for good)."""

    failures = 0
    status = 200
    seen: list[str] = []
    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        type(self).bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
        type(self).seen.append(self.path)
        if type(self).failures > 0:
            type(self).failures -= 1
            code, body = 503, b'{"error": {"code": "down", "message": "restarting"}}'
        else:
            code = type(self).status
            body = b'{"ok": true}' if code == 200 else b'{"error": {"code": "invalid_field", "message": "no"}}'
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.django_db(transaction=False)
def test_the_client_retries_transient_failures_a_bounded_number_of_times_and_never_a_refusal():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        sleeps: list[float] = []
        _Flaky.failures, _Flaky.status = 2, 200
        ControlClient(url, "t", attempts=4, sleep=sleeps.append).heartbeat(hostname="w", executing=[])
        assert sleeps == [1.0, 2.0]
        _Flaky.failures, sleeps[:] = 10, []
        with pytest.raises(ControlUnavailable, match="after 3 tries"):
            ControlClient(url, "t", attempts=2, sleep=sleeps.append).heartbeat(hostname="w", executing=[])
        assert sleeps == [1.0, 2.0]
        _Flaky.failures, _Flaky.status, sleeps[:] = 0, 400, []
        _Flaky.seen.clear()
        with pytest.raises(ControlRefused):
            ControlClient(url, "t", attempts=4, sleep=sleeps.append).heartbeat(hostname="w", executing=[])
        assert sleeps == [] and len(_Flaky.seen) == 1  # a refusal is an answer: never sent again
        # A retried claim says that the first try may have landed (so its own claim is handed back).
        _Flaky.failures, _Flaky.status = 1, 200
        _Flaky.bodies.clear()
        ControlClient(url, "t", attempts=2, sleep=sleeps.append).claim("r", worker="w")
        assert [b["again"] for b in _Flaky.bodies] == [False, True]
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ControlUnavailable):  # nothing listens there any more: refused at once
        ControlClient(url, "t", attempts=0).heartbeat(hostname="w", executing=[])


@pytest.mark.django_db(transaction=False)
def test_a_runner_holds_no_database_credentials():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNO_")}
    env.update(DYNO_ENV="development", DYNO_ROLE="runner")
    refused = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0 and "DYNO_ROLE=runner holds no database credentials" in refused.stderr
    env.pop("DATABASE_URL", None)
    probe = ("import django; django.setup()\n"
             "import runs.runner, fleet.worker, fleet.tasks\n"  # what a runner worker loads
             "from runs.models import Run\n"
             "try:\n    Run.objects.count()\nexcept Exception as exc:\n    print('refused', type(exc).__name__)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT / "platform",
                          env={**env, "DJANGO_SETTINGS_MODULE": "dyno.settings"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused ImproperlyConfigured" in done.stdout
    env.update(DYNO_ENV="production", CELERY_BROKER_URL="redis://127.0.0.1:6379/0")
    missing = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode != 0 and "needs DYNO_CONTROL_URL, DYNO_RUNNER_TOKEN" in missing.stderr
    env.update(DYNO_CONTROL_URL="http://dyno.internal", DYNO_RUNNER_TOKEN="dyno_runner_x")
    plain = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode != 0 and "over https:// only" in plain.stderr  # the key travels with every request


@pytest.mark.django_db(transaction=False)
def test_the_development_servers_log_leaves_out_runners_successful_calls():
    import logging

    from dyno.quiet import QuietControlApi

    def line(path: str, status: int) -> logging.LogRecord:
        record = logging.LogRecord("django.server", logging.INFO, __file__, 1, '"%s" %s %s', (f"POST {path} HTTP/1.1", status, 12), None)
        record.status_code = status
        return record

    quiet = QuietControlApi()
    assert not quiet.filter(line("/runner/v1/workers/heartbeat", 200))
    assert quiet.filter(line("/runner/v1/workers/heartbeat", 401))  # a refused runner is worth a line
    assert quiet.filter(line("/api/v1/runs", 200))


def test_outside_the_runner_networks_the_control_api_is_not_there(client, settings, runner_token):
    import ipaddress

    headers = {"HTTP_AUTHORIZATION": f"Bearer {runner_token}"}
    body = {"hostname": "w1@host", "executing": []}
    settings.DYNO_CONTROL_API_NETWORKS = [ipaddress.ip_network("10.20.0.0/16")]
    answer = client.post("/runner/v1/workers/heartbeat", body, content_type="application/json", **headers)
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"
    settings.DYNO_CONTROL_API_NETWORKS = [ipaddress.ip_network("127.0.0.0/8")]
    answer = client.post("/runner/v1/workers/heartbeat", body, content_type="application/json", **headers)
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "not_registered"  # reached, then judged
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNO_")}
    env.update(DYNO_ENV="development", DYNO_CONTROL_API_NETWORKS="10.20.0.0/16,runners")
    refused = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode != 0 and "'runners' is not a network" in refused.stderr


def test_the_fleet_page_shows_runner_keys_and_which_key_each_runner_holds_never_a_token(admin_client, live_server):
    # The runner registers with an empty fingerprint (what a host that fell could send): the page still renders.
    _, token = runner_key_create(name="h200-pool", hardware=["gpu-h200"])
    _, cpu_token = runner_key_create(name="cpu-pool", hardware=["cpu"])
    ControlClient(live_server.url, cpu_token, attempts=0).register(hostname="cpu0@box", queues=["cpu"], fingerprint={})
    runner_key_revoke(name="cpu-pool")
    page = admin_client.get("/fleet").content.decode()
    assert "h200-pool" in page and "gpu-h200" in page and "cpu-pool" in page and "revoked" in page
    assert "cpu0@box" in page and token not in page and cpu_token not in page
    assert "dyno_runner_" not in page
    # A runner that never calibrated is said to bill nothing (the platform's default rule); it has
    # just registered, so it is online.
    assert "not calibrated: its figures do not bill" in page and ">online<" in page


def test_without_the_requirement_a_runner_with_no_calibration_records_none(live_server, queued, runner_token, settings):
    # Where the operator vouches for the fleet otherwise, an uncalibrated runner's result records no
    # calibration block at all (it is not known to fail), and the fleet page says only that.
    settings.DYNO_REQUIRE_RUNNER_CALIBRATION = False
    run = queued()
    client = ControlClient(live_server.url, runner_token, attempts=0)
    _registered(client, "w1@host")
    client.claim(str(run.pk), worker="w1@host")
    assert client.succeed(str(run.pk), worker="w1@host", result={"schema": "dyno.suite-result/1", "verdict": "accepted",
                                                                 "workloads": [], "environment": {"device": "cpu"}})
    run.refresh_from_db()
    assert "runner_calibration" not in run.result["environment"] and runner_calibrated(run.result) is True


def test_a_keys_last_use_is_kept_to_the_minute_not_written_on_every_request(db):
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from fleet.keys import runner_key_for
    from fleet.models import RunnerKey

    key, token = runner_key_create(name="busy-pool", hardware=["cpu"])
    assert key.last_used_at is None
    runner_key_for(token)
    first = RunnerKey.objects.get(pk=key.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        runner_key_for(token)
    assert len(queries) == 1 and RunnerKey.objects.get(pk=key.pk).last_used_at == first  # read, not written
    RunnerKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now() - timedelta(minutes=2))
    runner_key_for(token)
    assert RunnerKey.objects.get(pk=key.pk).last_used_at > first
