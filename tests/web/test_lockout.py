"""Sign-in lock-out per account, per address and per proven browser; the client address behind
trusted proxies; the admin's sign-in under the same rules; per-address throttles on public forms."""

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse

from accounts.clients import DEVICE_COOKIE, client_address
from accounts.models import SigninFailure

pytestmark = pytest.mark.django_db

OWNER = "owner@acme.test"
PASSWORD = "correct-horse-battery"
SIGNIN = "/signin"


def _signin(client: Client, email: str, password: str, address: str = "198.51.100.7", **extra):
    return client.post(SIGNIN, {"email": email, "password": password}, REMOTE_ADDR=address, **extra)


@pytest.fixture
def owner(make_org):
    make_org("acme", owner=OWNER)
    return OWNER


def test_it_lets_a_real_user_in_after_a_flood_of_made_up_names_from_their_address(client, owner, settings):
    """Behind the proxy every user shares its address: the flood must not lock them out."""
    settings.DYNO_SIGNIN_ADDRESS_MAX_FAILURES = 20
    for i in range(20):
        assert _signin(client, f"nobody{i}@example.test", "guess", address="10.0.0.1").status_code == 200
    flooded = _signin(client, "nobody-else@example.test", "guess", address="10.0.0.1")
    assert flooded.status_code == 429
    assert b"from your network" in flooded.content and b"Try again in" in flooded.content
    assert 1 <= int(flooded["Retry-After"]) <= settings.DYNO_SIGNIN_LOCKOUT_SECONDS
    # A user who never failed, on a browser that never signed in, with the right password: in.
    response = _signin(Client(), owner, PASSWORD, address="10.0.0.1")
    assert response.status_code == 302 and response["Location"] == reverse("front:dashboard")
    # The same user mistyping there is answered like the flood (and it counts towards their account).
    assert _signin(Client(), owner, "typo", address="10.0.0.1").status_code == 429


def test_it_locks_an_account_under_password_guessing_from_anywhere(client, owner, settings):
    settings.DYNO_SIGNIN_MAX_FAILURES = 5
    for i in range(5):
        response = _signin(client, owner, f"guess-{i}", address=f"203.0.113.{i + 1}")
        assert b"do not match" in response.content
    locked = _signin(Client(), owner, PASSWORD, address="192.0.2.200")
    assert locked.status_code == 429
    assert b"Too many failed sign-ins for this account" in locked.content and b"Try again in" in locked.content
    assert 850 <= int(locked["Retry-After"]) <= 900
    # Another account is untouched.
    assert SigninFailure.objects.filter(username=owner).count() == 5


def test_it_lifts_the_lock_when_the_failures_leave_the_window(client, owner, settings):
    settings.DYNO_SIGNIN_MAX_FAILURES = 2
    for _ in range(2):
        _signin(client, owner, "wrong")
    assert _signin(client, owner, PASSWORD).status_code == 429
    SigninFailure.objects.update(at=SigninFailure.objects.first().at.replace(year=2020))
    assert _signin(client, owner, PASSWORD).status_code == 302


def test_it_keeps_a_proven_browser_signed_in_while_strangers_lock_the_account(owner, settings):
    settings.DYNO_SIGNIN_MAX_FAILURES = 3
    mine = Client()
    assert _signin(mine, owner, PASSWORD, address="192.0.2.10").status_code == 302
    assert mine.cookies[DEVICE_COOKIE].value
    mine.post(reverse("front:signout"))
    attacker = Client()
    for _ in range(3):
        _signin(attacker, owner, "guess", address="203.0.113.66")
    assert _signin(attacker, owner, PASSWORD, address="203.0.113.66").status_code == 429
    assert _signin(Client(), owner, PASSWORD, address="192.0.2.10").status_code == 429  # no proof, same address
    assert _signin(mine, owner, PASSWORD, address="192.0.2.10").status_code == 302
    # The proven browser's own failures lock it alone; the strangers' failures stay counted.
    mine.post(reverse("front:signout"))
    for _ in range(3):
        assert _signin(mine, owner, "typo", address="192.0.2.10").status_code == 200
    assert _signin(mine, owner, PASSWORD, address="192.0.2.10").status_code == 429
    assert SigninFailure.objects.filter(username=owner, device="").count() == 3


def test_it_forgets_only_the_signed_in_clients_own_failures(client, owner, settings):
    settings.DYNO_SIGNIN_MAX_FAILURES = 5
    for _ in range(2):
        _signin(Client(), owner, "guess", address="203.0.113.9")
    _signin(client, owner, "typo", address="192.0.2.10")
    assert _signin(client, owner, PASSWORD, address="192.0.2.10").status_code == 302
    assert list(SigninFailure.objects.values_list("address", flat=True)) == ["203.0.113.9"] * 2


def test_it_takes_the_client_hop_from_the_trusted_proxy_header(settings):
    factory = RequestFactory()
    request = factory.post(SIGNIN, REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="6.6.6.6, 203.0.113.5")
    assert client_address(request) == "10.0.0.2"  # off by default: a client writes that header itself
    settings.DYNO_TRUSTED_PROXY_HEADER = "X-Forwarded-For"
    settings.DYNO_TRUSTED_PROXY_COUNT = 1
    assert client_address(request) == "203.0.113.5"
    settings.DYNO_TRUSTED_PROXY_COUNT = 2
    assert client_address(request) == "6.6.6.6"
    settings.DYNO_TRUSTED_PROXY_COUNT = 3  # it did not pass three proxies: only the peer is known
    assert client_address(request) == "10.0.0.2"
    settings.DYNO_TRUSTED_PROXY_COUNT = 1
    for raw, expected in (("[2001:db8::7]:443", "2001:db8::7"), ("192.0.2.1:8080", "192.0.2.1"),
                          ("not-an-address", "10.0.0.2"), ("", "10.0.0.2")):
        hop = factory.get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=raw)
        assert client_address(hop) == expected


def test_it_locks_addresses_apart_behind_the_proxy_when_the_header_is_set(owner, settings):
    settings.DYNO_TRUSTED_PROXY_HEADER = "X-Forwarded-For"
    settings.DYNO_SIGNIN_ADDRESS_MAX_FAILURES = 3
    attacker = Client()
    for i in range(4):
        _signin(attacker, f"made-up-{i}@example.test", "x", address="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.66")
    assert set(SigninFailure.objects.values_list("address", flat=True)) == {"203.0.113.66"}
    # A colleague's typo behind the same proxy gets the usual answer, not the attacker's lock.
    typo = _signin(Client(), owner, "typo", address="10.0.0.1", HTTP_X_FORWARDED_FOR="192.0.2.44")
    assert typo.status_code == 200 and b"do not match" in typo.content


def test_it_locks_the_admin_sign_in_the_same_way(client, make_org, settings, django_user_model):
    settings.DYNO_SIGNIN_MAX_FAILURES = 3
    django_user_model.objects.create_superuser("root@dyno.test", "root@dyno.test", PASSWORD)
    login = reverse("admin:login")
    for _ in range(3):
        response = client.post(login, {"username": "root@dyno.test", "password": "guess"}, REMOTE_ADDR="203.0.113.1")
        assert response.status_code == 200
    assert SigninFailure.objects.filter(username="root@dyno.test").count() == 3
    locked = client.post(login, {"username": "root@dyno.test", "password": PASSWORD}, REMOTE_ADDR="203.0.113.1")
    assert locked.status_code == 429 and 1 <= int(locked["Retry-After"]) <= 900
    assert b"Too many failed sign-ins for this account" in locked.content
    assert client.get(reverse("admin:index")).status_code == 302
    SigninFailure.objects.all().delete()
    response = client.post(login, {"username": "root@dyno.test", "password": PASSWORD}, REMOTE_ADDR="203.0.113.1")
    assert response.status_code == 302 and client.get(reverse("admin:index")).status_code == 200


def test_it_throttles_posts_to_public_forms_per_address(client, owner, settings):
    settings.DYNO_THROTTLE_ANONYMOUS_POSTS = 3
    # Windows are fixed and epoch-aligned: with the default minute, a test that straddles a minute
    # boundary starts counting again (it failed so in CI). A week-long window has no boundary here.
    settings.DYNO_THROTTLE_WINDOW_SECONDS = 7 * 86400
    for _ in range(3):
        assert _signin(client, owner, "guess", address="198.51.100.1").status_code == 200
    throttled = _signin(client, owner, PASSWORD, address="198.51.100.1")
    assert throttled.status_code == 429 and b"Too many requests to this form" in throttled.content
    assert 1 <= int(throttled["Retry-After"]) <= settings.DYNO_THROTTLE_WINDOW_SECONDS
    assert SigninFailure.objects.count() == 3  # refused before any password was checked
    assert _signin(Client(), owner, PASSWORD, address="198.51.100.2").status_code == 302  # another address
    for _ in range(3):
        assert client.post(reverse("reports:verify"), REMOTE_ADDR="198.51.100.1").status_code == 400
    verify = client.post(reverse("reports:verify"), REMOTE_ADDR="198.51.100.1")
    assert verify.status_code == 429 and verify["Retry-After"]


def test_it_refuses_an_oversized_sign_in_form_unread(client):
    response = client.post(SIGNIN, data=b"x" * (70 * 1024), content_type="application/x-www-form-urlencoded")
    assert response.status_code == 413


def test_it_throttles_api_key_guessing_per_address(client, make_org, make_key, settings):
    settings.DYNO_THROTTLE_BAD_KEYS = 3
    good = make_key(make_org())
    for guess in range(3):
        refused = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer dyno_guess_{guess}")
        assert refused.status_code == 401
    throttled = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {good}")
    assert throttled.status_code == 429 and throttled.json()["error"]["code"] == "throttled"
    assert "valid key" in throttled.json()["error"]["message"] and int(throttled["Retry-After"]) >= 1
    elsewhere = client.get("/api/v1/models", HTTP_AUTHORIZATION=f"Bearer {good}", REMOTE_ADDR="192.0.2.7")
    assert elsewhere.status_code == 200
