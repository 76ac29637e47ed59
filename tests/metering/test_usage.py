"""Usage ingestion through POST /api/v1/usage/batch: per-event statuses, the time window,
idempotency (also under concurrency, with separate connections) and append-only storage."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.utils import timezone



def _post(client: Client, key: str, events: list[dict]):
    return client.post("/api/v1/usage/batch", data={"events": events}, content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


def _event(deployment, key: str, *, when=None, hours: object = "1.5") -> dict:
    when = when or timezone.now() - timedelta(hours=1)
    return {"idempotency_key": key, "deployment": str(deployment.pk), "timestamp": when.isoformat(),
            "gpu_hours": hours}


@pytest.fixture
def live(db, make_org, make_key, make_report, make_contract, make_deployment):
    org = make_org("acme")
    make_contract(org)
    deployment = make_deployment(org, make_report(org), name="prod", active_from=timezone.now() - timedelta(days=20))
    other = make_org("other")
    make_contract(other)
    foreign = make_deployment(other, make_report(other), name="theirs",
                              active_from=timezone.now() - timedelta(days=20))
    return {"org": org, "deployment": deployment, "foreign": foreign, "key": make_key(org, "customer")}


def test_it_reports_each_events_fate(live):
    from metering.models import UsageEvent

    client, deployment, now = Client(), live["deployment"], timezone.now()
    event_a, event_k = _event(deployment, "a"), _event(deployment, "k")
    first = _post(client, live["key"], [event_a, _event(deployment, "b", hours="0.25")])
    assert first.status_code == 200 and first.json()["created"] == 2
    events = [
        event_a,  # same key, same payload
        _event(deployment, "b", hours="0.26"),  # same key, different payload
        _event(live["foreign"], "c"),  # another organization's deployment
        _event(deployment, "d", when=now - timedelta(days=36)),
        _event(deployment, "e", when=now + timedelta(minutes=6)),
        _event(deployment, "f", hours=1.5),  # a JSON number: a float
        _event(deployment, "g", hours="1.0000001"),
        {"idempotency_key": "h", "deployment": str(deployment.pk), "timestamp": "2026-01-01T00:00:00",
         "gpu_hours": "1"},
        _event(deployment, "i", when=deployment.active_from - timedelta(minutes=1)),
        _event(deployment, "j", hours="-2"),
        event_k,
        event_k,  # the same event twice in one batch
        {**_event(deployment, "l"), "deployment": ["not", "an", "id"]},
        _event(deployment, "nul\x00byte"),
        "not an object",
    ]
    response = _post(client, live["key"], events)
    assert response.status_code == 200
    results = response.json()["results"]
    statuses = [(r["idempotency_key"], r["status"], r.get("reason", {}).get("code")) for r in results]
    assert statuses == [
        ("a", "duplicate", None),
        ("b", "rejected", "idempotency_conflict"),
        ("c", "rejected", "deployment_not_found"),
        ("d", "rejected", "timestamp_too_old"),
        ("e", "rejected", "timestamp_in_future"),
        ("f", "rejected", "invalid_gpu_hours"),
        ("g", "rejected", "invalid_gpu_hours"),
        ("h", "rejected", "invalid_timestamp"),
        ("i", "rejected", "before_deployment"),
        ("j", "rejected", "invalid_gpu_hours"),
        ("k", "created", None),
        ("k", "duplicate", None),
        ("l", "rejected", "deployment_not_found"),
        ("nul\x00byte", "rejected", "invalid_idempotency_key"),
        (None, "rejected", "invalid_event"),
    ]
    assert response.json()["created"] == 1 and response.json()["duplicate"] == 2
    assert UsageEvent.objects.filter(organization=live["org"]).count() == 3
    assert not UsageEvent.objects.filter(deployment=live["foreign"]).exists()


def test_it_treats_equal_values_written_differently_as_the_same_payload(live):
    client, deployment = Client(), live["deployment"]
    when = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    _post(client, live["key"], [_event(deployment, "x", when=when, hours="1.5")])
    again = _post(client, live["key"], [{"idempotency_key": "x", "deployment": str(deployment.pk).upper(),
                                        "timestamp": when.astimezone(timezone.get_fixed_timezone(120)).isoformat(),
                                        "gpu_hours": "1.500000"}])
    assert again.json()["results"][0]["status"] == "duplicate"


def test_it_refuses_batches_it_cannot_read(live, make_key):
    client, deployment = Client(), live["deployment"]
    too_many = [_event(deployment, f"k{i}") for i in range(1001)]
    assert _post(client, live["key"], too_many).json()["error"]["code"] == "batch_too_large"
    assert _post(client, live["key"], []).status_code == 400
    finance_key = make_key(live["org"], "finance")
    assert _post(client, finance_key, [_event(deployment, "z")]).status_code == 403
    assert _post(client, "dyno_nope_nope", [_event(deployment, "z")]).status_code == 401


def test_it_keeps_usage_events_append_only(live, ingest):
    from metering.models import UsageEvent

    ingest(live["deployment"], [(timezone.now().strftime("%Y-%m-%d %H:%M"), "2")], now=timezone.now())
    event = UsageEvent.objects.get(deployment=live["deployment"])
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        UsageEvent.objects.filter(pk=event.pk).update(gpu_hours="20")
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM metering_usageevent WHERE id = %s", [event.pk])
    with pytest.raises(IntegrityError), transaction.atomic():
        # Even in SQL, an event cannot name another organization's deployment.
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO metering_usageevent (organization_id, deployment_id, idempotency_key, "
                           "occurred_at, gpu_hours, payload_sha256) VALUES (%s, %s, 'sneaky', now(), 1, '')",
                           [live["org"].pk, live["foreign"].pk])
    assert UsageEvent.objects.get(pk=event.pk).gpu_hours == 2


@pytest.mark.django_db(transaction=True)
def test_it_counts_a_batch_once_when_it_is_posted_twice_at_once(make_org, make_key, make_report, make_contract,
                                                                 make_deployment):
    from metering.models import UsageEvent

    org = make_org("acme")
    make_contract(org)
    deployment = make_deployment(org, make_report(org), name="prod", active_from=timezone.now() - timedelta(days=3))
    key = make_key(org, "customer")
    batch = [_event(deployment, f"{uuid.uuid4().hex}-{i}", hours=f"0.{i + 1:03d}") for i in range(1000)]
    start = threading.Barrier(2)
    outcomes: list[dict] = []

    def post() -> None:
        try:
            client = Client()
            start.wait(timeout=30)
            outcomes.append(_post(client, key, batch).json())
        finally:
            connection.close()  # each thread had its own connection; give it back

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 2
    # Whichever insert reached a key first created it; the other waited on the unique index and
    # found it a duplicate. Together: every event created exactly once.
    assert sum(o["created"] for o in outcomes) == 1000
    assert sum(o["duplicate"] for o in outcomes) == 1000
    assert sum(o["rejected"] for o in outcomes) == 0
    assert UsageEvent.objects.filter(organization=org).count() == 1000


@pytest.mark.django_db(transaction=True)
def test_it_waits_for_an_uncommitted_insert_of_the_same_keys_then_counts_them_as_duplicates(
        make_org, make_report, make_contract, make_deployment):
    from metering.usage import usage_ingest

    org = make_org("acme")
    make_contract(org)
    deployment = make_deployment(org, make_report(org), name="prod", active_from=timezone.now() - timedelta(days=3))
    batch = [_event(deployment, f"key-{i}") for i in range(50)]
    inserted, release = threading.Event(), threading.Event()
    statuses: dict[str, list[str]] = {}

    def first() -> None:
        try:
            with transaction.atomic():  # holds the inserted keys uncommitted until released
                statuses["first"] = [r.status.value for r in usage_ingest(organization_id=org.pk, events=batch)]
                inserted.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def second() -> None:
        try:
            inserted.wait(timeout=30)
            statuses["second"] = [r.status.value for r in usage_ingest(organization_id=org.pk, events=batch)]
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    inserted.wait(timeout=30)
    threads[1].join(timeout=1.0)
    assert threads[1].is_alive(), "the second insert should wait on the first one's uncommitted keys"
    release.set()
    for thread in threads:
        thread.join(timeout=30)
    assert statuses["first"] == ["created"] * 50
    assert statuses["second"] == ["duplicate"] * 50
