"""The one error type of metering's services: a request that cannot be honoured.
`code` is machine-readable (the API's error code), the message says what was wrong and what to do."""

from __future__ import annotations


class BillingError(ValueError):
    def __init__(self, code: str, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status

    def __str__(self) -> str:
        return self.message
