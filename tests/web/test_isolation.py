"""Another organization's objects are a 404 on every URL and endpoint that takes an id."""

import json

import pytest
from django.urls import reverse

from runs.models import Run
from runs.services import run_start

from .helpers import upload_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def foreign(make_org, sample_models, media_root, django_capture_on_commit_callbacks):
    """Objects of org "victim", and a signed-in member plus a key of org "intruder"."""
    from accounts.selectors import Actor

    victim = make_org("victim", owner="owner@victim.test")
    version = upload_version(org=victim, folder=sample_models["llama"])
    with django_capture_on_commit_callbacks(execute=False):
        run = run_start(actor=Actor(roles={victim.pk: "owner"}), version=version, hardware="cpu")
    make_org("intruder", owner="owner@intruder.test")
    return {"version": version, "model": version.model, "run": run}


WEB_GETS = [("front:model-detail", "model"), ("front:version-detail", "version"),
            ("front:run-detail", "run"), ("front:run-status", "run")]
WEB_POSTS = [("front:run-create", "version"), ("front:run-cancel", "run")]
API_GETS = [("api:model-detail", "model"), ("api:model-version-detail", "version"), ("api:run-detail", "run")]
API_POSTS = [("api:run-cancel", "run")]


@pytest.mark.parametrize("name, kind", WEB_GETS + WEB_POSTS)
def test_it_hides_foreign_objects_in_the_web_ui(client, foreign, name, kind):
    client.login(username="owner@intruder.test", password="correct-horse-battery")
    url = reverse(name, args=[foreign[kind].pk])
    response = client.post(url, {"hardware": "cpu"}) if (name, kind) in WEB_POSTS else client.get(url)
    assert response.status_code == 404
    assert Run.objects.count() == 1 and Run.objects.get().status == "queued"


@pytest.mark.parametrize("name, kind", API_GETS + API_POSTS)
def test_it_hides_foreign_objects_in_the_api(client, foreign, make_key, name, kind):
    from accounts.models import Organization

    raw = make_key(Organization.objects.get(slug="intruder"))
    url = reverse(name, args=[foreign[kind].pk])
    call = client.post if (name, kind) in API_POSTS else client.get
    response = call(url, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert Run.objects.get().status == "queued"


def test_it_refuses_a_run_of_a_foreign_version(client, foreign, make_key):
    from accounts.models import Organization

    raw = make_key(Organization.objects.get(slug="intruder"))
    response = client.post("/api/v1/runs", json.dumps({"model_version": str(foreign["version"].pk), "hardware": "cpu"}),
                           content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 404
    assert Run.objects.count() == 1


def test_it_lists_only_own_objects(client, foreign, make_key):
    from accounts.models import Organization

    raw = make_key(Organization.objects.get(slug="intruder"))
    auth = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    assert client.get("/api/v1/models", **auth).json() == {"models": [], "next": None}
    assert client.get("/api/v1/runs", **auth).json() == {"runs": [], "next": None}
    client.login(username="owner@intruder.test", password="correct-horse-battery")
    page = client.get(reverse("front:models")).content.decode()
    assert foreign["model"].name not in page


def test_it_keeps_the_fleet_page_for_staff(client, foreign):
    client.login(username="owner@intruder.test", password="correct-horse-battery")
    assert client.get(reverse("front:fleet")).status_code == 302
