"""The error contract of everything under /api/: `{"error": {"code", "message"}}` for every status,
with a message that says what to change and no exception text or server path (those are logged).

The API application (api/app.py) turns what a route raises into these responses; the handlers here do
the same for what happens outside an endpoint (an unknown path, a failure before the view), and
fall back to Django's HTML pages for every path that is not under /api/.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.core.exceptions import (
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from api.bounded import InputRejected

log = logging.getLogger(__name__)

API_PREFIX = "/api/"


class ApiError(Exception):
    """A refusal with its status; `retry_after` (seconds), when a subclass sets it, is sent as
    Retry-After."""

    retry_after: int | None = None

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def is_api_path(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX)


NOT_FOUND_PATH = ("No such endpoint: check the method and path against /api/v1/openapi.json "
                  "(ids in paths are UUIDs, e.g. 0f8c2d1e-5b7a-4c1e-9a3b-2d4e6f8a0b1c).")
NOT_FOUND_OBJECT = "No such object: the id is unknown, or it belongs to an organization this key does not read."


def _too_large(limit_hint: str = "") -> JsonResponse:
    return error_response(413, "request_too_large", "The request body is larger than this endpoint accepts"
                                                    f"{limit_hint}; send less (split a batch, shard a file).")


def internal_response(request: HttpRequest, exc: BaseException | None) -> JsonResponse:
    """A failure on Dyno's side, logged with an incident id; the answer names the incident only."""
    return _internal(request, exc)


def _internal(request: HttpRequest, exc: BaseException | None) -> JsonResponse:
    incident = uuid.uuid4().hex[:12]
    actor = getattr(request, "actor", None)
    log.error("API %s %s failed (incident %s, actor %s)", request.method, request.path, incident,
              getattr(actor, "audit_label", "anonymous"), exc_info=exc)
    return error_response(500, "internal_error", f"Dyno failed on its side while answering (incident {incident}). "
                                                 "Retry later; if it persists, send us the incident id.")


def exception_response(request: HttpRequest, exc: Exception) -> JsonResponse:
    """The JSON answer for anything a view under /api/ raised; our own bugs are logged with an
    incident id that the customer can quote."""
    if isinstance(exc, ApiError):
        response = error_response(exc.status, exc.code, exc.message)
        if exc.retry_after is not None:
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, InputRejected):
        status = 413 if exc.code == "too_large" else 400
        return error_response(status, "request_too_large" if status == 413 else exc.code, exc.message)
    if isinstance(exc, Http404):
        return error_response(404, "not_found", NOT_FOUND_OBJECT)
    if isinstance(exc, PermissionDenied):
        return error_response(403, "forbidden", "This key may not do that.")
    if isinstance(exc, RequestDataTooBig):
        return _too_large()
    if isinstance(exc, (TooManyFilesSent, TooManyFieldsSent)):
        return error_response(400, "too_many_parts", "The request holds more files or form fields than Dyno "
                                                     "accepts; send fewer (a model folder is config.json and its "
                                                     "weights).")
    if isinstance(exc, (MultiPartParserError, UnreadablePostError)):
        return error_response(400, "bad_request", "The request body could not be read as the Content-Type it "
                                                  "declares; send multipart/form-data or JSON, whole.")
    if isinstance(exc, SuspiciousOperation):
        log.warning("API %s %s refused: %s", request.method, request.path, type(exc).__name__)
        return error_response(400, "bad_request", "The request was refused as malformed; check its headers "
                                                  "and body.")
    return _internal(request, exc)


# -- handlers for what fails outside an endpoint (dyno/urls.py installs them) ---------------------


def bad_request(request: HttpRequest, exception: Exception, **kwargs: Any) -> HttpResponse:
    if not is_api_path(request):
        return defaults.bad_request(request, exception, **kwargs)
    if isinstance(exception, RequestDataTooBig):
        return _too_large()
    return error_response(400, "bad_request", "The request was refused as malformed; check its headers and body.")


def permission_denied(request: HttpRequest, exception: Exception, **kwargs: Any) -> HttpResponse:
    if not is_api_path(request):
        return defaults.permission_denied(request, exception, **kwargs)
    return error_response(403, "forbidden", "This request is not allowed here.")


def page_not_found(request: HttpRequest, exception: Exception, **kwargs: Any) -> HttpResponse:
    if not is_api_path(request):
        return defaults.page_not_found(request, exception, **kwargs)
    return error_response(404, "not_found", NOT_FOUND_PATH)


def server_error(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    if not is_api_path(request):
        return defaults.server_error(request, **kwargs)
    # Django's request logger has logged the exception with its traceback already.
    return error_response(500, "internal_error", "Dyno failed on its side while answering; it is logged. "
                                                 "Retry later.")


@csrf_exempt
def unknown_endpoint(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """The last URL pattern under /api/: no endpoint matched (a non-UUID id included). A view, not
    only handler404, so the answer is JSON with DEBUG on too."""
    return error_response(404, "not_found", NOT_FOUND_PATH)
