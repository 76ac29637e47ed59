"""The guard in front of every view: anonymous file uploads refused before their body is read,
per-address throttles on the public forms, and lock-outs and quotas answered with 429 (or 409).

It runs in the middleware chain before any view hook, so before CsrfViewMiddleware parses a
multipart body to look for its token.
"""

from __future__ import annotations

from typing import Callable

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve
from django.utils import timezone

from accounts.clients import client_address, device_cookie_set
from accounts.selectors import Actor, actor_for_user
from accounts.throttle import LimitReached, Throttled, wait_phrase, window_bounds, window_take, window_used
from api.auth import authenticate as api_key_actor
from api.bounded import content_length
from api.errors import ApiError, error_response, is_api_path
from catalog.services import upload_quota_check

# The forms anyone may post to: throttled per client address, and the only ones that read a
# multipart body from nobody in particular (/verify caps its own size).
PUBLIC_FORMS = frozenset({"front:signin", "admin:login", "reports:verify"})
SIGNIN_FORMS = frozenset({"front:signin", "admin:login"})
SIGNIN_FORM_MAX_BYTES = 64 * 1024  # an email, a password and a CSRF token, with room to spare
MODEL_UPLOADS = frozenset({"front:upload", "api:models"})
# Content-Length also counts the multipart framing and form fields: a body within this much of the
# room left is let through to be counted exactly (catalog.services.upload_quota_charge).
UPLOAD_FRAMING_SLACK = 1 << 20
CONTROL_PREFIX = "/runner/"  # the runners' control API (fleet.control_api): JSON answers too


def limit_response(request: HttpRequest, limit: LimitReached) -> HttpResponse:
    """A refusal as JSON under /api/ and as a page elsewhere, with Retry-After when time lifts it."""
    if is_api_path(request):
        response = error_response(limit.status, limit.code, limit.message)
    else:
        response = render(request, "limit_reached.html", {"limit": limit}, status=limit.status)
    if limit.retry_after is not None:
        response["Retry-After"] = str(limit.retry_after)
    return response


class RequestGuard:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        api = is_api_path(request)
        if any("\x00" in key or any("\x00" in value for value in values) for key, values in request.GET.lists()):
            # PostgreSQL holds no NUL in text: a filter with one failed inside the query (a red team, 2026-12-06).
            message = "The query string holds a NUL character (%00), which Dyno neither stores nor searches for; remove it."
            if api or request.path_info.startswith(CONTROL_PREFIX):
                return error_response(400, "invalid_text", message)
            return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")
        if api:
            refused = _bad_keys_refusal(request)
            if refused is not None:
                return refused
        response = self._before_body(request) if request.method == "POST" else None
        if response is None:
            response = self._respond(request)
        if api and response.status_code == 401:
            window_take(key=_bad_keys_key(request), amount=1, limit=1 << 30,
                        seconds=settings.DYNO_THROTTLE_WINDOW_SECONDS)
        return response

    def _respond(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        proof = getattr(request, "signin_device_proof", None)
        if proof:
            device_cookie_set(response, proof)
        refused_signin = getattr(request, "signin_refused", None)
        if refused_signin is not None and response.status_code != refused_signin.status:
            # /admin/login/ re-rendered its form as for a wrong password: answer the lock-out instead.
            return limit_response(request, refused_signin)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, LimitReached):  # a quota, from a page's view (the API answers its own)
            return limit_response(request, exception)
        return None

    def _before_body(self, request: HttpRequest) -> HttpResponse | None:
        try:
            view_name = resolve(request.path_info).view_name
        except Resolver404:
            return None
        declared = content_length(request.META)
        if view_name in SIGNIN_FORMS and declared is not None and declared > SIGNIN_FORM_MAX_BYTES:
            return HttpResponse(f"A sign-in form is a few hundred bytes; this request declares {declared:,}.",
                                status=413, content_type="text/plain; charset=utf-8")
        try:
            if view_name in PUBLIC_FORMS:
                _throttle(request, view_name)
            elif request.content_type.startswith("multipart/"):
                actor = _uploader(request)
                if isinstance(actor, HttpResponse):
                    return actor
                if view_name in MODEL_UPLOADS:
                    refused = _upload_refusal(request, actor, declared)
                    if refused is not None:
                        return refused
                    _upload_room(actor, declared)
        except LimitReached as limit:
            return limit_response(request, limit)
        return None


def _bad_keys_key(request: HttpRequest) -> str:
    return f"api401:{client_address(request) or 'unknown'}"


def _bad_keys_refusal(request: HttpRequest) -> HttpResponse | None:
    """429 for an address whose API requests were refused for their key too often this window."""
    seconds = settings.DYNO_THROTTLE_WINDOW_SECONDS
    if window_used(key=_bad_keys_key(request), seconds=seconds) < settings.DYNO_THROTTLE_BAD_KEYS:
        return None
    _, end = window_bounds(seconds=seconds)
    wait = max(1, int((end - timezone.now()).total_seconds()) + 1)
    return limit_response(request, Throttled(
        f"Too many requests with a missing, unknown or revoked API key from your address. Try again "
        f"{wait_phrase(wait)} with a valid key.", retry_after=wait))


def _throttle(request: HttpRequest, view_name: str) -> None:
    address = client_address(request) or "unknown"
    wait = window_take(key=f"post:{view_name}:{address}", amount=1, limit=settings.DYNO_THROTTLE_ANONYMOUS_POSTS,
                       seconds=settings.DYNO_THROTTLE_WINDOW_SECONDS)
    if wait is not None:
        raise Throttled(f"Too many requests to this form from your address. Try again {wait_phrase(wait)}.",
                        retry_after=wait)


def _uploader(request: HttpRequest) -> Actor | HttpResponse:
    """Who sends this multipart body, from the session cookie or the API key alone; the refusal
    (without reading the body) when nobody is signed in."""
    if is_api_path(request):
        try:
            return api_key_actor(request)
        except ApiError as exc:
            return error_response(exc.status, exc.code, exc.message)
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    return actor_for_user(request.user)


def _refusal(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    if is_api_path(request):
        return error_response(status, code, message)
    return HttpResponse(message, status=status, content_type="text/plain; charset=utf-8")


def _upload_refusal(request: HttpRequest, actor: Actor, declared: int | None) -> HttpResponse | None:
    """A model upload that cannot succeed, refused before its body is read: no length declared
    (411), a role that may not upload (403), more bytes than any upload may have (413)."""
    if declared is None:
        return _refusal(request, 411, "length_required",
                        "Send the upload with a Content-Length header (a chunked body is not accepted).")
    organization = actor.default_org_id
    if organization is None or not actor.can_write(organization):
        return _refusal(request, 403, "forbidden", "Your role cannot upload models; ask an owner of the organization.")
    limit = settings.DYNO_UPLOAD_MAX_TOTAL_BYTES
    if declared > limit + UPLOAD_FRAMING_SLACK:
        return _refusal(request, 413, "too_large",
                        f"This upload declares {declared:,} bytes; a model may have at most {limit:,}. "
                        "Upload fewer or smaller files.")
    return None


def _upload_room(actor: Actor, declared: int) -> None:
    """Refuse a model upload the organization's daily quota cannot hold, from its Content-Length."""
    if actor.default_org_id is not None:
        upload_quota_check(organization_id=actor.default_org_id, nbytes=declared, slack=UPLOAD_FRAMING_SLACK)
