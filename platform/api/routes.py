"""How a route of the API is declared: who may call it (an organization API key of one of its
scopes), what it answers (typed models, every refusal an `Error`), and the request bodies that a
view reads itself but the document still names. No side effects: the application that mounts the
routes is api/app.py, imported by the URL configuration alone, so a route module can be imported
first, in any order.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import pydantic
from django.http import HttpRequest
from ninja import Router
from ninja.security import HttpBearer

from api.auth import authenticate
from api.errors import ApiError
from api.schemas import Error

CUSTOMER = ("customer",)
FINANCE = ("finance",)
AUDITOR = ("auditor",)

ERROR_TEXT = {
    400: "bad input: the message names the field and what it takes",
    401: "missing, unknown or revoked key",
    403: "key scope not allowed",
    404: "no such object in your organization",
    409: "conflicting state",
    413: "request body over this endpoint's cap (judged from Content-Length, before it is read)",
}


class Bearer(HttpBearer):
    """An organization API key, `Authorization: Bearer dyno_<prefix>_<secret>`, whose scope is one
    of `scopes`. Refusals say which of the three things was wrong (no key, not Bearer, unknown key)."""

    openapi_description = "An organization API key: dyno_<prefix>_<secret> (Settings, or manage.py create_api_key)"

    def __init__(self, scopes: tuple[str, ...]) -> None:
        super().__init__()
        self.scopes = scopes

    def __call__(self, request: HttpRequest) -> Any:
        actor = authenticate(request)
        if actor.api_key.scope not in self.scopes:
            raise ApiError(403, "forbidden_scope", f"This endpoint needs a key with scope {' or '.join(self.scopes)}; "
                                                   f"this key's scope is {actor.api_key.scope}.")
        request.actor = actor
        return actor

    def authenticate(self, request: HttpRequest, token: str) -> Any:  # pragma: no cover - __call__ decides
        raise NotImplementedError


def responses(ok: dict[int, Any], *errors: int) -> dict[int, Any]:
    """An operation's answers: its successes and the errors it may give (every one an `Error`)."""
    return {**ok, **{status: Error for status in errors}}


def route(router: Router, method: str, path: str, *, name: str, summary: str, ok: dict[int, Any],
          errors: Iterable[int], scopes: tuple[str, ...] = CUSTOMER, **options: Any) -> Callable:
    """Declare one operation: its method and path, who may call it, what it answers. Keys an answer
    lacks are left out (exclude_unset), as the serializers leave them."""
    statuses = sorted({401, 403, *errors})  # every route needs a key, and a key of one of its scopes
    return router.api_operation([method], path, auth=Bearer(scopes), response=responses(ok, *statuses),
                                url_name=name, summary=summary, exclude_unset=True, **options)


# Request bodies a view validates itself (it reads multipart or JSON), referred to by name from an
# operation's openapi_extra; their schemas join the document's components.
DOCUMENTED: list[type[pydantic.BaseModel]] = []


def documented(model: type[pydantic.BaseModel]) -> dict[str, str]:
    """A reference to `model` in the document's components (added there when it is generated)."""
    if model not in DOCUMENTED:
        DOCUMENTED.append(model)
    return {"$ref": f"#/components/schemas/{model.__name__}"}
