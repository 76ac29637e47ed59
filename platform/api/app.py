"""The API under /api/v1/ as one django-ninja application: the routes of api/views.py,
reports/api.py and metering/api.py, typed by pydantic models (api/schemas.py and each app's
schemas), with the OpenAPI document generated from those same models at /api/v1/openapi.json.

Imported by the URL configuration (dyno/urls.py) alone: a route module declares its routes with
api/routes.py and never imports this one, so the application is built after every route exists.
What ninja does not decide here: authentication (an organization API key, with the scopes each
route allows), the error contract (api/errors.py: `{"error": {"code", "message"}}` for every
status, 405 included), and how a JSON body is read (api/bounded.py: refused from its Content-Length
before a byte is read, nesting bounded).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import pydantic
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.urls import URLPattern
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from api.auth import JSON_BODY_MAX_BYTES, json_body, json_too_large
from api.bounded import content_length
from api.errors import error_response, exception_response
from api.routes import DOCUMENTED, ERROR_TEXT


class BoundedParser(Parser):
    """JSON bodies read within bounds (api/auth.json_body): 413 from Content-Length, 400 when not a
    JSON object or nested too deep."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        return json_body(request)


def _validation_error(request: HttpRequest, exc: ValidationError | pydantic.ValidationError) -> HttpResponse:
    """A request that does not fit its model: a query parameter is `invalid_<name>`, a body field
    `missing_field` or `invalid_field`; the message names each field and what it takes. (A body
    that a view validates itself, as the audit's multipart form, raises pydantic's own error.)"""
    if isinstance(exc, pydantic.ValidationError):
        found = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
    else:
        found = exc.errors
    problems, codes = [], set()
    for error in found[:6]:
        where, *inside = error.get("loc") or ("body",)
        field = ".".join(str(part) for part in inside if part not in ("payload", "body", "query")) or "the body"
        problem = f"{field}: {error.get('msg', 'invalid')}"
        if where == "query":
            name = str(inside[-1]) if inside else "query"
            codes.add(f"invalid_{name}")
            if name in request.GET:
                problem += f" (got {request.GET[name][:40]!r})"
        else:
            codes.add("missing_field" if error.get("type") == "missing" else "invalid_field")
        problems.append(problem)
    code = codes.pop() if len(codes) == 1 else "invalid_field"
    return error_response(400, code, "; ".join(problems) + ". See /api/v1/openapi.json for this endpoint's fields.")


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    """ninja's own refusals: a body its parser could not read carries our parser's reason."""
    if exc.__cause__ is not None:
        return exception_response(request, exc.__cause__)
    return error_response(exc.status_code, "bad_request", f"{exc}; see /api/v1/openapi.json for this endpoint.")


def _enveloped(callback: Callable) -> Callable:
    """A route's view as Django calls it: a JSON body declared over the cap is refused before ninja
    reads a byte of it (ninja reads `request.body` before its parser runs), and ninja's 405 answers
    in the error contract."""

    @functools.wraps(callback)
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        declared = content_length(request.META)
        if declared is not None and declared > JSON_BODY_MAX_BYTES and request.content_type == "application/json":
            return exception_response(request, json_too_large(declared, JSON_BODY_MAX_BYTES))
        response = callback(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            order = ("GET", "POST", "PUT", "PATCH", "DELETE")
            allowed = sorted(response["Allow"].split(", "), key=lambda m: order.index(m) if m in order else 9)
            response = error_response(405, "method_not_allowed", f"Use {' or '.join(allowed)} here.")
            response["Allow"] = ", ".join(allowed)
        return response

    view.csrf_exempt = True  # type: ignore[attr-defined]  # API keys, not cookies: no CSRF to check
    return view


class DynoApi(NinjaAPI):
    def set_default_exception_handlers(self) -> None:
        self.add_exception_handler(Exception, lambda request, exc: exception_response(request, exc))
        self.add_exception_handler(ValidationError, _validation_error)
        self.add_exception_handler(pydantic.ValidationError, _validation_error)
        self.add_exception_handler(HttpError, _http_error)
        self.add_exception_handler(AuthenticationError, lambda request, exc: error_response(
            401, "unauthenticated", "Send an API key as `Authorization: Bearer <key>`."))

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: dict | None = None):
        # Paths relative to the one server, /api/v1, as clients and fuzzers join them.
        document = super().get_openapi_schema(path_prefix="", path_params=path_params)
        for operations in document["paths"].values():  # each refusal says when it happens
            for operation in operations.values():
                for status, answer in operation["responses"].items():
                    answer["description"] = ERROR_TEXT.get(int(status), answer["description"])
        components = document["components"].setdefault("schemas", {})
        for model in DOCUMENTED:  # bodies that views read themselves (multipart or JSON), named in openapi_extra
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(schema.pop("$defs", {}))
            components[model.__name__] = schema
        return document

    def _get_urls(self) -> list:
        patterns = []
        for pattern in super()._get_urls():
            if isinstance(pattern, URLPattern) and pattern.name not in ("openapi-json", "api-root"):
                pattern.callback = _enveloped(pattern.callback)
            patterns.append(pattern)
        # ninja's root view lists nothing useful; the unknown-endpoint answer (dyno/urls.py) takes it.
        return [p for p in patterns if getattr(p, "name", None) != "api-root"]


def build() -> DynoApi:
    from api import views
    from metering import api as metering
    from reports import api as reports

    api = DynoApi(
        title="Dyno API", version="1", urls_namespace="api", parser=BoundedParser(), docs_url=None,
        servers=[{"url": "/api/v1"}],
        description="Upload models, run audited optimizations, read signed reports, meter usage and bill. Every "
                    "error, whatever its status (404, 405, 413 and 500 included), is JSON: "
                    "{\"error\": {\"code\", \"message\"}}. Generated from the code that answers.",
    )
    for part in (views, reports, metering):
        api.add_router("", part.router)
    return api


api = build()
