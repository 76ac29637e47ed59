"""Headless Chromium: finance signs in, bills a month, finalizes an invoice and downloads it as
CSV, XLSX and PDF."""

from __future__ import annotations

import csv
import io
import os
import shutil
from decimal import Decimal

import openpyxl
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture
def browser_page(monkeypatch):
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed: `apt-get install chromium` (scripts/services.sh does it)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(accept_downloads=True)
        page.set_default_timeout(30_000)
        yield page
        browser.close()


def test_it_lets_finance_bill_finalize_and_download_an_invoice(browser_page, live_server, operator_org, make_member,
                                                               make_org, make_contract, make_report, make_deployment,
                                                               ingest, settings, tmp_path):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    make_member(operator_org, "fin@dyno.test", "finance")
    acme = make_org("acme")
    make_contract(acme)
    ingest(make_deployment(acme, make_report(acme, ci_low="1.2"), name="prod"), [("2025-01-10 00:00", "200")])
    page = browser_page

    page.goto(live_server.url + "/signin")
    page.fill("input[name=email]", "fin@dyno.test")
    page.fill("input[name=password]", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")
    page.click("header nav >> text=Billing")
    page.click("text=Billing runs")
    page.fill("#period", "2025-01")
    page.click("#run-billing")
    page.wait_for_url("**/billing/runs/*")
    assert "Billed 2025-01: 1 draft invoices" in page.inner_text(".messages")
    page.click("table.invoices a")
    page.wait_for_url("**/billing/invoices/*")
    assert page.inner_text("#invoice-status") == "draft"
    page.click("#finalize")
    page.wait_for_selector("#invoice-status.finalized")
    number = page.inner_text("#invoice-number")
    assert number.startswith("INV-") and page.inner_text("#invoice-total") == "20.00 EUR"

    files = {}
    for fmt in ("CSV", "XLSX", "PDF"):
        with page.expect_download() as download:
            page.click(f"#downloads >> text={fmt}")
        path = tmp_path / download.value.suggested_filename
        download.value.save_as(path)
        files[fmt] = path
    rows = list(csv.DictReader(io.StringIO(files["CSV"].read_text())))
    assert [(r["kind"], r["fee"]) for r in rows] == [("usage", "20.00"), ("total", "20.00")]
    assert files["CSV"].name == f"{number}-acme.csv"
    header = dict(openpyxl.load_workbook(files["XLSX"])["Invoice"].iter_rows(min_row=2, values_only=True))
    assert header["invoice"] == number and Decimal(str(header["total"])) == Decimal("20.00")
    assert files["PDF"].read_bytes().startswith(b"%PDF-")
    page.screenshot(path=str(tmp_path / "invoice.png"), full_page=True)

    page.goto(live_server.url + "/billing/revenue")  # plotly.js comes from this server, not a CDN
    page.wait_for_selector("#revenue-by-month .main-svg")
    assert "2025-01" in page.inner_text("#revenue-by-month")
