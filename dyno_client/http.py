"""The API over HTTP with the standard library: bearer key, JSON in and out, the server's error
envelope turned into one readable line."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Iterable


class ApiFailure(Exception):
    """A request the server refused or could not answer; the message says what and why."""


class Api:
    def __init__(self, url: str, key: str, *, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = timeout

    def raw(self, method: str, path: str, *, body: bytes | Iterable[bytes] | None = None, length: int | None = None,
            content_type: str | None = None, authenticated: bool = True) -> bytes:
        request = urllib.request.Request(self.url + path, data=body, method=method)
        if authenticated:
            request.add_header("Authorization", f"Bearer {self.key}")
        if content_type:
            request.add_header("Content-Type", content_type)
        if length is not None:
            request.add_header("Content-Length", str(length))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raise ApiFailure(_explain(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiFailure(f"cannot reach {self.url}: {getattr(exc, 'reason', exc)}") from None

    def request(self, method: str, path: str, *, json_body: Any = None, body: bytes | Iterable[bytes] | None = None,
                length: int | None = None, content_type: str | None = None, authenticated: bool = True) -> Any:
        if json_body is not None:
            body = json.dumps(json_body).encode()
            length, content_type = len(body), "application/json"
        data = self.raw(method, path, body=body, length=length, content_type=content_type,
                        authenticated=authenticated)
        try:
            return json.loads(data)
        except ValueError:
            raise ApiFailure(f"{method} {path} answered something that is not JSON") from None


def _explain(exc: urllib.error.HTTPError) -> str:
    try:
        error = json.loads(exc.read()).get("error") or {}
        return f"HTTP {exc.code} {error.get('code', '')}: {error.get('message', '')}".strip()
    except (ValueError, AttributeError):
        return f"HTTP {exc.code} {exc.reason}"
