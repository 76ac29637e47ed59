"""Shared setup of the metering benchmarks: a fresh PostgreSQL database migrated from scratch,
Django configured on it, bulk-made organizations with contracts, signed-report rows and
deployments, and a description of the machine for the result files."""

from __future__ import annotations

import hashlib
import json
import os
import platform as stdlib_platform
import subprocess
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SERVER = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")


def prepare_database(name: str) -> str:
    """Drop and recreate `name`, migrate it, and return its URL."""
    import psycopg

    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    url = f"{SERVER}/{name}"
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], check=True,
                   env={**os.environ, "DATABASE_URL": url})
    return url


def drop_database(name: str) -> None:
    import psycopg

    from django.db import connections

    connections.close_all()
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DYNO_DEBUG"] = "False"  # DEBUG keeps every query in memory
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dyno.settings")
    for path in (str(ROOT / "platform"), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import django

    django.setup()


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), stdlib_platform.processor())
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE")
                                                                       * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "postgresql": server, "python": stdlib_platform.python_version(),
            "note": "client, web server and PostgreSQL on the same box, shared with other work",
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.now(UTC).isoformat(timespec="seconds")}


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"metering-{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def make_customers(*, organizations: int, deployments_per_org: int, contract_from: date, active_from: datetime,
                   tag: str = "bench") -> list[Any]:
    """Organizations with one contract each and deployments billed under signed-report rows
    (fake body bytes and signature: what metering needs). Returns the deployments."""
    from accounts.models import Organization
    from catalog.models import Model, ModelVersion
    from metering.models import Contract, Deployment, DeploymentReport
    from reports.models import Report
    from runs.models import Run

    orgs = Organization.objects.bulk_create(
        [Organization(slug=f"{tag}-{i:05d}", name=f"Customer {i}") for i in range(organizations)])
    modes = ["half_even", "half_up", "down"]
    Contract.objects.bulk_create([Contract(
        organization=org, version=1, effective_from=contract_from, revenue_share=Decimal("0.20"),
        prices={"gpu-h100": "2.50", "gpu-h200": "4.00"}, minimum_speedup=Decimal("1.05"),
        monthly_cap=Decimal("150.00") if i % 3 == 0 else None, currency="EUR" if i % 10 else "USD",
        rounding=modes[i % 3], suite_version="v1", baseline="eager PyTorch with the standard ops",
        created_by="benchmark") for i, org in enumerate(orgs)])
    models = Model.objects.bulk_create([Model(organization=org, name="llama") for org in orgs])
    versions = ModelVersion.objects.bulk_create([ModelVersion(
        model=model, number=1, kind="weights", family="llama", architecture="LlamaForCausalLM",
        parameter_count=8_000_000_000, dtype="bfloat16", config={}, storage_dir="/nonexistent")
        for model in models])
    plan = [(org, version, n) for org, version in zip(orgs, versions) for n in range(deployments_per_org)]
    runs = Run.objects.bulk_create([Run(organization=org, model_version=version, hardware=_hardware(n),
                                        status="succeeded", artifact_sha256="a" * 64) for org, version, n in plan])
    reports = Report.objects.bulk_create([report_row(org, run, index) for index, ((org, _, _), run)
                                          in enumerate(zip(plan, runs))])
    deployments = Deployment.objects.bulk_create([Deployment(
        organization=org, name=f"dep-{n}", model_version=version, hardware=_hardware(n), active_from=active_from)
        for org, version, n in plan])
    DeploymentReport.objects.bulk_create([DeploymentReport(deployment=d, report=r, effective_from=active_from)
                                          for d, r in zip(deployments, reports)])
    return deployments


def report_row(org: Any, run: Any, index: int) -> Any:
    from reports.models import Report

    ci_low = Decimal("0.98") + Decimal(index * 37 % 600) / 1000  # 0.980 .. 1.579
    body = json.dumps({"schema": "dyno.report/1", "suite": {"version": "v1"}, "run": str(run.pk),
                       "n": index}).encode()
    return Report(organization=org, kind="run", run=run, hardware=run.hardware, body=body,
                  body_sha256=hashlib.sha256(body).hexdigest(), key_id="bench-key", signature="c2ln" * 22,
                  model_speedup=ci_low + Decimal("0.05"), model_ci_low=ci_low, model_ci_high=ci_low + Decimal("0.1"),
                  stable=index % 10 != 0)


def _hardware(n: int) -> str:
    return "gpu-h100" if n % 2 == 0 else "gpu-h200"
