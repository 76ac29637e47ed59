"""Sign-in through the lock-out: every password check (the sign-in page, /admin/login/, anything
that calls `authenticate`) passes accounts.services' signin_* rules.

A refusal is left on the request as `request.signin_refused` (a SigninLocked); the sign-in page
renders it, dyno.guards answers it with 429 everywhere else.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest

from accounts.clients import device_proof, signin_attempt
from accounts.services import signin_failed, signin_refusal, signin_succeeded


class LockoutBackend(ModelBackend):
    """Django's ModelBackend behind the sign-in lock-out."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        attempt = signin_attempt(request, username)
        refusal = signin_refusal(attempt=attempt)
        if refusal is None:
            user = super().authenticate(request, username=username, password=password, **kwargs)
            if user is not None:
                return user
            refusal = signin_failed(attempt=attempt)
        if refusal is not None and request is not None:
            request.signin_refused = refusal
        return None


def signed_in(sender, request: HttpRequest | None, user, **kwargs) -> None:
    """`user_logged_in`: the client proved the account. Its failures are forgotten, and the browser
    gets a device proof (dyno.guards sets the cookie on the response)."""
    signin_succeeded(user=user, attempt=signin_attempt(request, user.get_username()))
    if request is not None:
        request.signin_device_proof = device_proof(user.get_username().strip().lower())
