"""The README, as a newcomer meets it: short, and every command in it runs as printed (those that
need a GPU excepted; `make demo` and `make test` run as dry runs here, since this is `make test`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def commands() -> list[str]:
    """Every command of the README's shell blocks: continuation lines joined, comments dropped."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        for line in joined.splitlines():
            command = line.split("  #", 1)[0].split(" # ", 1)[0].strip()
            if command and not command.startswith("#"):
                found.append(command)
    return found


def test_the_readme_fits_on_two_screens_and_names_its_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 130, f"README.md has {len(lines)} lines; keep it short and point into docs/"
    listed = commands()
    assert "make demo" in listed and "make test" in listed
    assert any("runner_key create" in c for c in listed) and any("-Q control" in c for c in listed)


def _environment(database: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DYNO_ROLE", "DYNO_RUNNER_TOKEN")}
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/dyno")
    env.update(DATABASE_URL=base.rsplit("/", 1)[0] + "/" + database, DYNO_ENV="development",
               DYNO_RUNNER_CALIBRATION="off", PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return env


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_every_readme_command_runs_as_printed(broker_clean, tmp_path):
    from django.db import connection

    from fleet.models import RunnerKey

    env = _environment(connection.settings_dict["NAME"])
    ran, skipped = [], []
    for command in commands():
        if "CUDA_VISIBLE_DEVICES" in command:
            skipped.append(command)  # needs a GPU
            continue
        if command.startswith("make "):
            done = subprocess.run(["make", "-n", *command.split()[1:]], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, (command, done.stderr)
        elif " worker " in command:
            # A long-running worker: it must start (its banner lists its queues) and keep running
            # without an error for a few seconds; then it is stopped.
            log = tmp_path / f"worker-{len(ran)}.log"
            with open(log, "w") as out:
                process = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline and process.poll() is None and "[queues]" not in log.read_text():
                    time.sleep(0.5)
                time.sleep(5)
                text = log.read_text()
                assert process.poll() is None and "[queues]" in text, (command, text[-3000:])
                assert "Traceback" not in text and "CRITICAL" not in text, (command, text[-3000:])
            finally:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
        else:
            done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
        ran.append(command)
    assert RunnerKey.objects.filter(name="h100-pool", hardware=["gpu-h100"]).exists()  # what the README made
    assert len(ran) >= 4 and len(skipped) == 1, (ran, skipped)
