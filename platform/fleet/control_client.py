"""The runner side of the control API (fleet.control_api): how a runner host, which holds no database
credentials, claims runs, reports on them and hands back their outcome.

It holds two settings: DYNO_CONTROL_URL (the platform's address as runners reach it) and
DYNO_RUNNER_TOKEN (its runner key). A request that meets a transient failure (the platform
restarting, a refused connection, a 5xx or 429) is sent again after 1, 2, 4 ... seconds, up to
DYNO_RUN_TRANSIENT_RETRIES more times; every request here is safe to repeat (the platform's writes
are conditional updates). Imports no model and no service: nothing here can reach the database.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from django.conf import settings

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0


class ControlUnavailable(RuntimeError):
    """The platform could not be reached, or kept failing, after every retry."""


class ControlRefused(RuntimeError):
    """The platform answered with a refusal (4xx): its code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class RunNotHeld(ControlRefused):
    """The run is not (or no longer) this worker's: cancelled, finished, or taken by another."""


def backoff_seconds(attempt: int) -> float:
    """1, 2, 4, 8 ... seconds, at most 30: long enough for the platform or its database to restart."""
    return min(30.0, 2.0 ** attempt)


class ControlClient:
    def __init__(self, base_url: str | None = None, token: str | None = None, *, attempts: int | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.base_url = (base_url or settings.DYNO_CONTROL_URL).rstrip("/") + "/runner/v1/"
        self.token = token if token is not None else settings.DYNO_RUNNER_TOKEN
        self.attempts = settings.DYNO_RUN_TRANSIENT_RETRIES if attempts is None else attempts
        self.sleep = sleep

    # -------------------------------------------------------------------- transport

    def _open(self, path: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method="GET" if body is None else "POST")
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310 (an operator-set http(s) URL)

    def request(self, path: str, body: dict[str, Any] | None = None, *, read: Callable[[Any], Any] | None = None,
                what: str = "", again: dict[str, Any] | None = None) -> Any:
        """POST `body` (GET when None) to `path`; the decoded answer, or `read(response)`. `again`
        is the body of every retry (when it must say that an earlier try may have landed)."""
        for attempt in range(self.attempts + 1):
            try:
                with self._open(path, body if attempt == 0 or again is None else again) as response:
                    return read(response) if read else json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as exc:
                if exc.code < 500 and exc.code != 429:
                    raise self._refusal(exc) from None
                problem: Exception = exc
            except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, reset, timed out, cut short
                problem = exc
            if attempt >= self.attempts:
                raise ControlUnavailable(f"the platform at {self.base_url} did not answer {what or path} "
                                         f"after {attempt + 1} tries ({type(problem).__name__}: {problem})")
            log.warning("control %s failed (%s); retry %d of %d", what or path, problem, attempt + 1, self.attempts)
            self.sleep(backoff_seconds(attempt))
        raise AssertionError("unreachable")

    @staticmethod
    def _refusal(exc: urllib.error.HTTPError) -> ControlRefused:
        try:
            error = json.loads(exc.read() or b"{}").get("error") or {}
        except ValueError:
            error = {}
        code, message = str(error.get("code", "refused")), str(error.get("message", exc.reason))
        kind = RunNotHeld if code in ("not_held", "not_queued") else ControlRefused
        return kind(exc.code, code, message)

    # -------------------------------------------------------------------- runs

    def claim(self, run_id: str, *, worker: str, again: bool = False) -> dict[str, Any]:
        """The run's job and the fingerprint this worker registered; RunNotHeld if it is not queued.
        `again` (a redelivered task) and every retry of this request accept a run this worker
        already holds: a claim that landed but whose answer was lost."""
        return self.request(f"runs/{run_id}/claim", {"worker": worker, "again": again}, what="claim",
                            again={"worker": worker, "again": True})

    def progress(self, run_id: str, *, worker: str, fraction: float, message: str = "", stage: str = "") -> None:
        self.request(f"runs/{run_id}/progress",
                     {"worker": worker, "fraction": fraction, "message": message, "stage": stage}, what="progress")

    def log(self, run_id: str, *, worker: str, message: str, level: str = "info") -> None:
        self.request(f"runs/{run_id}/log", {"worker": worker, "message": message, "level": level}, what="log")

    def succeed(self, run_id: str, *, worker: str, **outcome: Any) -> bool:
        return bool(self.request(f"runs/{run_id}/succeed", {"worker": worker, **outcome}, what="store").get("stored"))

    def fail(self, run_id: str, *, worker: str | None, error: str, outside: str | None = None) -> bool:
        body: dict[str, Any] = {"worker": worker or "", "error": error}
        if outside:
            body["outside"] = outside
        return bool(self.request(f"runs/{run_id}/fail", body, what="fail").get("failed"))

    def fetch_model(self, run_id: str, *, worker: str, files: list[dict[str, Any]], version: str, cache: Path) -> Path:
        """The model version's files under `cache`/`version`, each checked against its SHA-256 (a
        file already there and whole is not fetched again)."""
        root = cache / version
        for entry in files:
            name = str(entry["path"])
            if name.startswith("/") or ".." in Path(name).parts:
                raise ControlRefused(400, "invalid_path", f"the platform sent a model file path {name!r}")
            target = root / name
            if target.is_file() and _sha256(target) == entry["sha256"]:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".part")
            query = urllib.parse.urlencode({"worker": worker})
            self.request(f"runs/{run_id}/files/{urllib.parse.quote(name)}?{query}",
                         read=lambda response, partial=partial: _save(response, partial), what=f"file {name}")
            if _sha256(partial) != entry["sha256"]:
                partial.unlink(missing_ok=True)
                raise ControlUnavailable(f"model file {name} arrived with the wrong SHA-256; nothing was measured.")
            partial.replace(target)
        return root

    # -------------------------------------------------------------------- workers

    def register(self, *, hostname: str, queues: list[str], fingerprint: dict[str, Any]) -> dict[str, Any]:
        return self.request("workers/register", {"hostname": hostname, "queues": queues, "fingerprint": fingerprint},
                            what="register")

    def heartbeat(self, *, hostname: str, executing: list[str]) -> None:
        self.request("workers/heartbeat", {"hostname": hostname, "executing": executing}, what="heartbeat")

    def stopped(self, *, hostname: str) -> None:
        self.request("workers/stopped", {"hostname": hostname}, what="stopped")

    def calibration(self, *, hostname: str, calibration: dict[str, Any]) -> None:
        self.request("workers/calibration", {"hostname": hostname, "calibration": calibration}, what="calibration")


def _save(response: Any, path: Path) -> None:
    with open(path, "wb") as handle:
        while chunk := response.read(1 << 20):
            handle.write(chunk)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
