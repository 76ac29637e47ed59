"""Bearer API-key authentication for every endpoint under /api/v1/ (api/routes.Bearer adds the
scopes), and its JSON bodies read within bounds (api/app.BoundedParser, and the views that read
their own). What a view raises becomes the JSON error contract of api/errors.py."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from accounts.selectors import Actor, actor_for_key
from accounts.services import api_key_authenticate
from api.bounded import content_length, json_object_bounded
from api.errors import ApiError, error_response

__all__ = ["ApiError", "authenticate", "error_response", "json_body", "json_too_large", "JSON_BODY_MAX_BYTES"]

# The largest JSON body any endpoint needs: a full usage batch is ~0.4 MiB (the audit endpoint sets
# its own, smaller cap). Below DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB), past which Django refuses.
JSON_BODY_MAX_BYTES = 2 * 2**20


# Endpoints that judge each item of a batch themselves, a NUL character included (the usage batch
# rejects that event alone, with a reason, and stores the others).
PER_ITEM_BODIES = frozenset({"/api/v1/usage/batch"})


def json_body(request: HttpRequest, *, max_bytes: int = JSON_BODY_MAX_BYTES) -> dict[str, Any]:
    """The request's JSON object; refused (413) from its Content-Length before a byte is read when
    it is over `max_bytes`, and (400) when it is not JSON, nests too deep or holds a NUL character."""
    declared = content_length(request.META)
    if declared is not None and declared > max_bytes:
        raise json_too_large(declared, max_bytes)
    return json_object_bounded(request.body or b"{}", max_bytes=max_bytes, what="The request body",
                               refuse_nul=request.path_info not in PER_ITEM_BODIES)


def json_too_large(declared: int, max_bytes: int) -> ApiError:
    return ApiError(413, "request_too_large", f"The request body is {declared:,} bytes; this endpoint reads "
                                              f"at most {max_bytes:,}. Send less (e.g. split a batch).")


def authenticate(request: HttpRequest) -> Actor:
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
