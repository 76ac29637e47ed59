"""The building blocks every part of the OpenAPI document uses (errors, ids, pages), in a module of
their own so that the parts (api/openapi_metering.py, reports/api.py) and the document that merges
them (api/openapi.py) import in one direction only."""

from __future__ import annotations

from typing import Any

from api.pagination import DEFAULT_LIMIT, MAX_LIMIT

ERROR = {"$ref": "#/components/schemas/Error"}


def json_response(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def errors(*statuses: int) -> dict[str, Any]:
    text = {400: "bad input", 401: "missing, unknown or revoked key", 403: "key scope not allowed",
            404: "no such object in your organization", 409: "conflicting state",
            413: "request body over this endpoint's cap (judged from Content-Length, before it is read)"}
    return {str(s): json_response(ERROR, text[s]) for s in statuses}


def id_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}


def page_parameters() -> list[dict[str, Any]]:
    """The query parameters of every list (api/pagination.py): newest first by (created_at, id)."""
    return [
        {"name": "limit", "in": "query", "description": "rows on this page",
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}},
        {"name": "cursor", "in": "query", "description": "the previous page's `next`, unchanged; leave it out "
                                                          "for the first page",
         "schema": {"type": "string"}},
    ]


def page_schema(key: str, items: dict[str, Any]) -> dict[str, Any]:
    """A page of a list: its rows under `key` and the cursor of the next page."""
    return {"type": "object", "required": [key, "next"], "properties": {
        key: {"type": "array", "items": items},
        "next": {"type": ["string", "null"], "description": "pass as `cursor` for the next page; null on the last"}}}
