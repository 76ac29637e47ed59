"""What the command lines share (`python -m runners`, `python -m pipeline`): exit codes, the
argument parser that keeps argparse's errors readable, and progress lines on stderr."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from runners.names import PROFILE_NAMES, WORKLOAD_NAMES

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_CANNOT_RUN = 0, 1, 2


def fail(message: str) -> int:
    """Say why the command cannot run; its exit code."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_CANNOT_RUN


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep the message readable
        self.print_usage(sys.stderr)
        raise SystemExit(fail(f"{message} (see --help)"))


def progress_lines(quiet: bool) -> Callable[[float, str], None] | None:
    """A progress callback printing `[ 12.5%] message` lines to stderr, or None when quiet."""
    if quiet:
        return None

    def report(fraction: float, message: str) -> None:
        print(f"[{fraction:6.1%}] {message}", file=sys.stderr, flush=True)

    return report


def selection(profile: str, workloads: str) -> tuple[list[str], str | None]:
    """The workloads a `--workloads a,b` option names, or why the profile or a name is unknown."""
    if profile not in PROFILE_NAMES:
        return [], f"unknown profile {profile!r}; use one of {', '.join(PROFILE_NAMES)}"
    names = [n for n in workloads.split(",") if n]
    unknown = [n for n in names if n not in WORKLOAD_NAMES]
    if unknown:
        return names, f"unknown workload(s) {', '.join(unknown)}; use {', '.join(WORKLOAD_NAMES)}"
    return names, None


def write_json(path: Any, document: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
