"""What the command lines share (`python -m runners`, `python -m pipeline`): exit codes, the
argument parser that keeps argparse's errors readable, and progress lines on stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

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


def write_json(path: Any, document: Any) -> None:
    import json
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
