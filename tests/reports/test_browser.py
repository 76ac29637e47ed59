"""Headless Chromium: a member opens a report, plotly draws its charts from the locally served
script, and the PDF download is a PDF naming the model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.reports.builders import pdf_text

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
        context = browser.new_context(accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(30_000)
        blocked: list[str] = []
        # Nothing may come from outside the platform (no CDN): record and refuse any such request.
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("http://localhost")
                   else (blocked.append(route.request.url), route.abort()))
        page.blocked = blocked
        yield page
        browser.close()


def test_it_renders_the_report_charts_and_downloads_the_pdf(browser_page, live_server, make_org, make_report,
                                                            tmp_path: Path):
    page = browser_page
    acme = make_org("acme", owner="owner@acme.test")
    report = make_report(acme)
    base = live_server.url.replace("127.0.0.1", "localhost")

    page.goto(base + "/signin")
    page.fill("input[name=email]", "owner@acme.test")
    page.fill("input[name=password]", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")

    page.click("nav >> text=Reports")
    page.click(f"a[href='/reports/{report.pk}']")
    page.wait_for_selector("#chart-speedup svg.main-svg")
    page.wait_for_selector("#chart-latency svg.main-svg")
    assert page.locator("#chart-speedup .barlayer .point").count() >= 3
    assert page.locator("#chart-latency .boxlayer path").count() >= 6
    assert "signature valid" in page.inner_text("#signature-status")
    assert page.locator("#workloads tr.workload").count() == 3
    assert page.blocked == []

    with page.expect_download() as download:
        page.click("#download-pdf")
    pdf = Path(download.value.path()).read_bytes()
    assert pdf.startswith(b"%PDF")
    assert b"llama-tiny" in pdf_text(pdf)
    page.screenshot(path=str(os.environ.get("REPORT_SCREENSHOT", tmp_path / "report.png")), full_page=True)
