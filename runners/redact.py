"""What may be said to a customer about an exception: its type and message with the server's
paths and addresses taken out. Standard library only (the web tier imports it).

A run fails most often because of the model (a config the library cannot build, a shape it does
not support), so the exception's own words are worth showing; but they can carry where the
platform keeps files (`/var/lib/dyno/media/org-3/...`), which user a worker runs as, or a host's
address. A path keeps only its last component (`.../config.json`), an address becomes `<address>`.
"""

from __future__ import annotations

import re

_PATH = re.compile(r"(?<![\w.~-])(?:/[^\s/'\"(),:;\[\]{}<>]+)+/?")
_IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b")
_IPV6 = re.compile(r"\[[0-9a-fA-F:.]+\](?::\d+)?|(?<![\w:])(?:[0-9a-fA-F]{1,4})?(?::[0-9a-fA-F]{0,4}){2,7}(?![\w:])")
LIMIT = 1000


def _last_part(match: re.Match[str]) -> str:
    parts = [p for p in match.group(0).split("/") if p]
    return f".../{parts[-1]}" if parts else "/"


def _address(match: re.Match[str]) -> str:
    found = match.group(0)  # a clock time (12:30:45) is not an address: v6 has "::", 7 colons or brackets
    return "<address>" if found.startswith("[") or "::" in found or found.count(":") >= 7 else found


def redact(text: str, *, limit: int = LIMIT) -> str:
    """`text` with every absolute path cut to its last component and every IP address hidden,
    at most `limit` characters."""
    text = _PATH.sub(_last_part, text)
    text = _IPV4.sub("<address>", text)
    text = _IPV6.sub(_address, text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def exception_text(exc: BaseException, *, limit: int = LIMIT) -> str:
    """`Type: message` of an exception, redacted."""
    return redact(f"{type(exc).__name__}: {exc}", limit=limit)
