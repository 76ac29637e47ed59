"""Accounts: Argon2 passwords, sign-in lock-out, API keys shown once and stored hashed, commands."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.urls import reverse

from accounts.models import ApiKey
from accounts.services import api_key_authenticate, api_key_create, api_key_revoke
from auditlog.models import AuditEvent

pytestmark = pytest.mark.django_db


def test_it_hashes_passwords_with_argon2(make_org):
    make_org("acme", owner="owner@acme.test")
    user = get_user_model().objects.get(username="owner@acme.test")
    assert user.password.startswith("argon2")


def test_it_signs_in_and_records_it(client, make_org):
    make_org("acme", owner="owner@acme.test")
    response = client.post(reverse("front:signin"), {"email": "owner@acme.test", "password": "correct-horse-battery"})
    assert response.status_code == 302
    assert AuditEvent.objects.filter(action="signin.succeeded").count() == 1
    assert client.get(reverse("front:dashboard")).status_code == 200


def test_it_locks_out_after_repeated_failures(client, make_org, settings):
    settings.DYNO_SIGNIN_MAX_FAILURES = 3
    make_org("acme", owner="owner@acme.test")
    for _ in range(3):
        response = client.post(reverse("front:signin"), {"email": "owner@acme.test", "password": "wrong"})
        assert b"do not match" in response.content
    # Even the right password is refused while locked out.
    response = client.post(reverse("front:signin"), {"email": "owner@acme.test", "password": "correct-horse-battery"})
    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content
    assert AuditEvent.objects.filter(action="signin.failed").count() == 3
    assert client.get(reverse("front:dashboard")).status_code == 302


def test_it_ignores_an_offsite_next_after_sign_in(client, make_org):
    make_org("acme", owner="owner@acme.test")
    response = client.post(reverse("front:signin") + "?next=//evil.example/x",
                           {"email": "owner@acme.test", "password": "correct-horse-battery"})
    assert response["Location"] == reverse("front:dashboard")


def test_it_stores_only_the_digest_of_a_key(make_org):
    org = make_org("acme")
    key, raw = api_key_create(organization=org, scope="customer", name="ci")
    stored = ApiKey.objects.get(pk=key.pk)
    assert raw.startswith(f"dyno_{stored.prefix}_")
    assert raw not in (stored.digest, stored.prefix)
    assert api_key_authenticate(raw).pk == key.pk
    assert api_key_authenticate(raw + "x") is None
    assert ApiKey.objects.get(pk=key.pk).last_used_at is not None


def test_it_refuses_a_revoked_key(make_org):
    org = make_org("acme")
    key, raw = api_key_create(organization=org, scope="finance", name="books")
    api_key_revoke(key=key)
    assert api_key_authenticate(raw) is None
    assert AuditEvent.objects.filter(action="apikey.revoked", target=f"key:{key.prefix}").exists()


def test_it_creates_orgs_and_keys_from_the_command_line(db):
    out = StringIO()
    call_command("createorg", "beta", "--name", "Beta Corp", "--owner", "boss@beta.test", stdout=out)
    assert "created organization beta" in out.getvalue()
    out = StringIO()
    call_command("create_api_key", "--org", "beta", "--scope", "auditor", "--name", "audit", stdout=out)
    raw = out.getvalue().strip()
    key = api_key_authenticate(raw)
    assert key is not None and key.scope == "auditor" and key.organization.slug == "beta"


def test_it_shows_a_new_key_once_on_the_keys_page(client, make_org):
    make_org("acme", owner="owner@acme.test")
    client.login(username="owner@acme.test", password="correct-horse-battery")
    page = client.post(reverse("front:api-keys"), {"name": "deploy", "scope": "customer"})
    assert b"will not be shown again" in page.content
    assert b"dyno_" in page.content
    again = client.get(reverse("front:api-keys"))
    key = ApiKey.objects.get(name="deploy")
    assert key.prefix.encode() in again.content
    assert b"will not be shown again" not in again.content


def test_it_lets_only_owners_manage_keys(client, make_org, make_member):
    org = make_org("acme", owner="owner@acme.test")
    make_member(org, "dev@acme.test", role="member")
    client.login(username="dev@acme.test", password="correct-horse-battery")
    client.post(reverse("front:api-keys"), {"name": "sneaky", "scope": "finance"})
    assert not ApiKey.objects.filter(name="sneaky").exists()


def test_it_refuses_an_owner_who_mints_an_auditor_key_for_their_own_org(client, make_org):
    """The audited party cannot appoint its own auditor (who may request re-audits of its reports)."""
    org = make_org("acme", owner="owner@acme.test")
    client.login(username="owner@acme.test", password="correct-horse-battery")
    form = client.get(reverse("front:api-keys"))
    assert b"<option>customer</option>" in form.content and b"<option>auditor</option>" not in form.content
    page = client.post(reverse("front:api-keys"), {"name": "self-audit", "scope": "auditor"}, follow=True)
    assert b"granted by Dyno&#x27;s operators" in page.content
    assert not ApiKey.objects.filter(organization=org, scope="auditor").exists()


@pytest.mark.django_db
def test_the_demo_seed_gives_the_demo_organization_a_contract_on_the_suite_runners_measure():
    from metering.models import Contract
    from runners.suite import SUITE_VERSION as MEASURED

    for _ in range(2):  # make demo runs it at every start: one contract, not one per start
        call_command("seed_demo", stdout=StringIO())
    contract = Contract.objects.get(organization__slug="demo")
    assert contract.suite_version == MEASURED and "cpu" in contract.prices  # the demo's runner is a CPU one
    assert contract.effective_from.day == 1 and contract.effective_to is None
