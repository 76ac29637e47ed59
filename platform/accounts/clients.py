"""Who is at the other end of a request: the client's address behind the trusted proxies the
settings name, and the signed proof a browser keeps that it signed in to an account before.
"""

from __future__ import annotations

import ipaddress
import secrets
from datetime import timedelta

from django.conf import settings
from django.core import signing
from django.http import HttpRequest, HttpResponse

from accounts.services import SigninAttempt

DEVICE_COOKIE = "dyno_device"
# A browser that signed in to an account is trusted with it this long: another party's failures
# on that account do not lock it out (its own failures lock it, as a device).
DEVICE_PROOF_DAYS = 30
_DEVICE_SALT = "dyno.accounts.signin-device"


def _ip(text: str) -> str | None:
    text = text.strip()
    if text.startswith("["):  # [2001:db8::1]:443
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # 192.0.2.1:443
        text = text.partition(":")[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def client_address(request: HttpRequest | None) -> str | None:
    """The client's address: REMOTE_ADDR, or, when DYNO_TRUSTED_PROXY_HEADER is set, the hop that
    the outermost of DYNO_TRUSTED_PROXY_COUNT proxies recorded (counted from the right, since
    every proxy appends and a client can write anything to the left)."""
    if request is None:
        return None
    remote = _ip(request.META.get("REMOTE_ADDR", ""))
    header = settings.DYNO_TRUSTED_PROXY_HEADER
    if not header:
        return remote
    raw = request.META.get("HTTP_" + header.upper().replace("-", "_"), "")
    hops = [hop for hop in (part.strip() for part in raw.split(",")) if hop]
    count = settings.DYNO_TRUSTED_PROXY_COUNT
    if len(hops) < count:
        # It did not come through every trusted proxy (a direct connection): only the peer is known.
        return remote
    return _ip(hops[-count]) or remote


def device_proof(username: str) -> str:
    """A new signed proof that this browser just signed in to `username` (the cookie's value)."""
    return signing.dumps({"u": username, "d": secrets.token_hex(8)}, salt=_DEVICE_SALT)


def proven_device(request: HttpRequest | None, username: str) -> str:
    """The device id of this browser if it signed in to `username` within DEVICE_PROOF_DAYS, else ""."""
    token = request.COOKIES.get(DEVICE_COOKIE, "") if request is not None else ""
    if not token:
        return ""
    try:
        proof = signing.loads(token, salt=_DEVICE_SALT, max_age=timedelta(days=DEVICE_PROOF_DAYS))
    except signing.BadSignature:
        return ""
    if not isinstance(proof, dict) or proof.get("u") != username:
        return ""
    return str(proof.get("d", ""))[:32]


def device_cookie_set(response: HttpResponse, proof: str) -> None:
    response.set_cookie(DEVICE_COOKIE, proof, max_age=DEVICE_PROOF_DAYS * 86400, httponly=True,
                        secure=settings.SESSION_COOKIE_SECURE, samesite="Lax")


def signin_attempt(request: HttpRequest | None, username: str) -> SigninAttempt:
    username = username.strip().lower()[:254]
    return SigninAttempt(username=username, address=client_address(request),
                         device=proven_device(request, username))
