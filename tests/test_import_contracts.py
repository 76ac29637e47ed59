"""The trust boundary in the file tree, checked: the import contracts in .importlinter hold.

The judge (runners) imports neither the optimizer, the pipeline nor the web tier; the optimizer
imports neither its judge nor the pipeline; proof needs only cryptography and the standard
library; web code loads no torch. Every exception is named in the contract file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'platform'}"}
    return subprocess.run([str(LINT), str(config), "--no-cache"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    completed = _lint(ROOT / ".importlinter")
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert "7 kept, 0 broken" in completed.stdout


def test_the_named_exceptions_are_real_and_the_contracts_catch_them(tmp_path):
    """Without its named exceptions the web tier's contract breaks on exactly those imports: the
    contracts read the real import graph, so what they name is really there."""
    text = (ROOT / ".importlinter").read_text()
    stripped = re.sub(r"ignore_imports =\n(?:    .*\n)+", "", text)
    assert stripped != text
    config = tmp_path / "contracts.ini"
    config.write_text(stripped)
    completed = _lint(config)
    assert completed.returncode == 1
    assert "runs.runner -> pipeline.model_run" in completed.stdout
    assert "catalog.validation -> runners.modelload" in completed.stdout
    assert "0 broken" not in completed.stdout
