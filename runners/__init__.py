"""The audited side of Dyno: suite v1, measurement protocol, verification, sandbox, results, CLI.

Import-light on purpose: importing `runners` loads no torch; the heavy modules load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["audit_candidate", "run_suite", "QuickGrader"]


def __getattr__(name: str) -> Any:
    # PEP 562 lazy attributes: Celery and Django import `runners` without paying for torch.
    if name in __all__:
        from runners import evaluate

        return getattr(evaluate, name)
    raise AttributeError(f"module 'runners' has no attribute {name!r}")
