"""Response headers Django does not set by itself: the Content-Security-Policy on every answer.

Scripts run only from this origin's files (no inline <script>, no on* attributes, no eval), so a
string that slips past escaping into a page cannot run.
"""

from __future__ import annotations

from typing import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class ContentSecurityPolicyMiddleware:
    """Adds `settings.DYNO_CONTENT_SECURITY_POLICY` to every response that has none of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = settings.DYNO_CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response.headers:
            response.headers["Content-Security-Policy"] = policy
        return response
