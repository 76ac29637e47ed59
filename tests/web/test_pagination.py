"""Every API list pages by cursor: newest first by (created_at, id), `limit` (default 50, at most
200), an opaque `cursor`, and `next` (null on the last page); runs list without a query per run,
and no run names the worker's host."""

from __future__ import annotations

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _auth(key: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _walk(client, path: str, key: str, list_key: str, **params) -> list[list[dict]]:
    pages, cursor = [], None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = client.get(path, query, **_auth(key))
        assert response.status_code == 200, response.content
        body = response.json()
        pages.append(body[list_key])
        cursor = body["next"]
        if cursor is None:
            return pages
        assert len(pages) < 50, "the cursor does not move"


@pytest.fixture
def owner(make_org, make_key):
    org = make_org()
    return org, make_key(org)


def test_it_walks_every_model_once_newest_first_across_equal_timestamps(client, owner, make_org):
    from catalog.models import Model

    org, key = owner
    Model.objects.bulk_create([Model(organization=org, name=f"m{i}") for i in range(7)])
    Model.objects.create(organization=make_org(), name="someone else's")
    same = timezone.now()
    Model.objects.filter(name__in=["m1", "m2", "m3", "m4"]).update(created_at=same)  # ties broken by id
    Model.objects.filter(name="m6").update(created_at=same + timezone.timedelta(seconds=1))

    pages = _walk(client, "/api/v1/models", key, "models", limit=3)
    assert [len(page) for page in pages] == [3, 3, 1]
    listed = [m["id"] for page in pages for m in page]
    expected = [str(pk) for pk in Model.objects.filter(organization=org).order_by("-created_at", "-id")
                .values_list("id", flat=True)]
    assert listed == expected and len(set(listed)) == 7


def test_a_row_written_between_pages_shifts_nothing(client, owner):
    from catalog.models import Model

    org, key = owner
    for i in range(4):
        Model.objects.create(organization=org, name=f"m{i}")
    first = client.get("/api/v1/models", {"limit": 2}, **_auth(key)).json()
    Model.objects.create(organization=org, name="newer")
    second = client.get("/api/v1/models", {"limit": 2, "cursor": first["next"]}, **_auth(key)).json()
    assert [m["name"] for m in first["models"] + second["models"]] == ["m3", "m2", "m1", "m0"]
    assert second["next"] is None


def test_it_pages_fifty_by_default_and_at_most_two_hundred(client, owner):
    from catalog.models import Model

    org, key = owner
    Model.objects.bulk_create([Model(organization=org, name=f"m{i:03d}") for i in range(205)])
    default = client.get("/api/v1/models", **_auth(key)).json()
    assert len(default["models"]) == 50 and default["next"]
    largest = client.get("/api/v1/models", {"limit": 200}, **_auth(key)).json()
    assert len(largest["models"]) == 200 and largest["next"]
    rest = client.get("/api/v1/models", {"limit": 200, "cursor": largest["next"]}, **_auth(key)).json()
    assert len(rest["models"]) == 5 and rest["next"] is None


@pytest.mark.parametrize("limit", ["0", "201", "ten", "-1"])
def test_it_refuses_a_limit_out_of_range(client, owner, limit):
    response = client.get("/api/v1/models", {"limit": limit}, **_auth(owner[1]))
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_limit"
    assert f"limit: Input should be" in response.json()["error"]["message"] and repr(limit) in response.json()["error"]["message"]


# Not base64; an empty list; ["yesterday", "1"]; a naive time with an id that is no UUID.
@pytest.mark.parametrize("cursor", ["garbage", "W10", "WyJ5ZXN0ZXJkYXkiLCIxIl0",
                                    "WyIyMDI1LTAxLTAxVDAwOjAwOjAwIiwieCJd"])
def test_it_refuses_a_cursor_it_did_not_answer(client, owner, cursor):
    response = client.get("/api/v1/runs", {"cursor": cursor}, **_auth(owner[1]))
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_cursor"


def _runs(org, count: int) -> None:
    from catalog.models import Model, ModelVersion
    from runs.models import Run, WorkloadResult

    model, _ = Model.objects.get_or_create(organization=org, name="llama")
    version = model.versions.first() or ModelVersion.objects.create(
        model=model, number=1, kind="weights", family="llama", architecture="LlamaForCausalLM",
        parameter_count=1000, dtype="float32", config={}, storage_dir="/nonexistent/pagination")
    for _ in range(count):
        run = Run.objects.create(organization=org, model_version=version, hardware="cpu", status="succeeded",
                                 worker="runner-7@gpu-host-12",
                                 result={"schema": "dyno.suite-result/1"}, inventory={"workloads": []},
                                 model_speedup=1.2, model_ci_low=1.1, model_ci_high=1.3, stable=True)
        WorkloadResult.objects.bulk_create([
            WorkloadResult(run=run, name=name, family="norm", dtype="float32", verdict="accepted", speedup=1.2,
                           ci_low=1.1, ci_high=1.3, weight=0.5) for name in ("rmsnorm", "softmax")])


def test_runs_list_in_a_fixed_number_of_queries_and_names_no_worker(client, owner, django_assert_max_num_queries):
    org, key = owner
    _runs(org, 3)
    with django_assert_max_num_queries(6) as few:
        small = client.get("/api/v1/runs", **_auth(key)).json()
    _runs(org, 25)
    with django_assert_max_num_queries(len(few.captured_queries)):
        large = client.get("/api/v1/runs", {"limit": 200}, **_auth(key)).json()
    assert len(small["runs"]) == 3 and len(large["runs"]) == 28
    assert all(len(run["workloads"]) == 2 for run in large["runs"])
    assert "gpu-host-12" not in str(large) and all("worker" not in run for run in large["runs"])
    detail = client.get(f"/api/v1/runs/{large['runs'][0]['id']}", **_auth(key)).json()
    assert "worker" not in detail and "gpu-host-12" not in str(detail)


def test_the_openapi_document_lists_the_paging_of_every_list(client):
    document = client.get("/api/v1/openapi.json").json()
    paths, schemas = document["paths"], document["components"]["schemas"]

    def answer(path):
        reference = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        return schemas[reference.rsplit("/", 1)[-1]]

    lists = {path for path, item in paths.items()
             if "get" in item and "application/json" in item["get"]["responses"].get("200", {}).get("content", {})
             and "next" in answer(path).get("properties", {})}
    assert lists == {"/models", "/runs", "/reports", "/contracts", "/deployments", "/billing-runs", "/invoices",
                     "/invoices/{invoice_id}/credit-notes"}
    for path in lists:
        parameters = {p["name"]: p for p in paths[path]["get"]["parameters"]}
        limit = parameters["limit"]["schema"]
        assert (limit["type"], limit["minimum"], limit["maximum"], limit["default"]) == ("integer", 1, 200, 50), path
        assert parameters["cursor"]["in"] == "query", path
        following = answer(path)["properties"]["next"]
        assert {"type": "null"} in following["anyOf"] and "next" in answer(path)["required"]
        assert "400" in paths[path]["get"]["responses"]


def test_the_web_lists_page_by_the_same_cursor_and_keep_their_filters(client, make_org):
    import re

    from catalog.models import Model
    from django.contrib.auth import get_user_model

    org = make_org("acme", owner="owner@acme.test")
    Model.objects.bulk_create([Model(organization=org, name=f"model-{i:03d}") for i in range(105)])
    user = get_user_model().objects.get(email="owner@acme.test")
    client.force_login(user)
    first = client.get("/models/?keep=1").content.decode()
    assert first.count("model-") == 100
    older = re.search(r'href="(\?[^"]*cursor=[^"]+)" rel="next"', first).group(1).replace("&amp;", "&")
    assert "keep=1" in older  # filters stay in the link
    second = client.get(f"/models/{older}").content.decode()
    assert second.count("model-") == 5 and 'rel="next"' not in second and ">Newest</a>" in second
    shown = set(re.findall(r"model-\d{3}", first)) | set(re.findall(r"model-\d{3}", second))
    assert len(shown) == 105  # every row once
    broken = client.get("/models/?cursor=not-a-cursor")
    assert broken.status_code == 200 and b"start again without it" in broken.content
    assert broken.content.decode().count("model-") == 100
