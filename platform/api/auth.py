"""Bearer API-key authentication and JSON errors for every endpoint under /api/v1/."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any, Callable

from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from accounts.selectors import Actor, actor_for_key
from accounts.services import api_key_authenticate

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def json_body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"The request body is not valid JSON ({exc}).") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "The request body must be a JSON object.")
    return body


def _authenticate(request: HttpRequest) -> Actor:
    header = request.headers.get("Authorization", "")
    if not header:
        raise ApiError(401, "unauthenticated", "Send an API key as `Authorization: Bearer <key>`; "
                                               "create one with `manage.py create_api_key` or in Settings.")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthenticated", "Use the Bearer scheme: `Authorization: Bearer <key>`.")
    key = api_key_authenticate(token.strip())
    if key is None:
        raise ApiError(401, "invalid_key", "This API key is unknown or revoked: create a new one.")
    return actor_for_key(key)


def api_endpoint(*, methods: tuple[str, ...], scopes: tuple[str, ...] | None = ("customer",),
                 public: bool = False) -> Callable:
    """Authenticate, check method and scope, and turn errors into JSON. `request.actor` is set."""

    def decorate(view: Callable) -> Callable:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any):
            try:
                if request.method not in methods:
                    raise ApiError(405, "method_not_allowed", f"Use {' or '.join(methods)} here.")
                if not public:
                    request.actor = _authenticate(request)
                    if scopes is not None and request.actor.api_key.scope not in scopes:
                        raise ApiError(403, "forbidden_scope",
                                       f"This endpoint needs a key with scope {' or '.join(scopes)}; "
                                       f"this key's scope is {request.actor.api_key.scope}.")
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status, exc.code, exc.message)
            except Http404:
                return error_response(404, "not_found", "No such object.")

        return wrapper

    return decorate
