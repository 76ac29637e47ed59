"""Headless Chromium: a customer signs in, uploads a model folder, starts a run and sees it succeed."""

import os
import shutil

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture
def browser_page(monkeypatch):
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed: `apt-get install chromium` (scripts/services.sh does it)")
    # Playwright's sync API runs an event loop in this thread; the ORM calls here are still synchronous.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        page.set_default_timeout(30_000)
        yield page
        browser.close()


def test_it_uploads_a_model_and_watches_its_run_succeed(browser_page, live_server, make_org, start_worker,
                                                        sample_models, tmp_path):
    page = browser_page
    make_org("acme", owner="owner@acme.test")
    # The page is under test, not the optimizer: no whole-model compile (the worker test runs it).
    start_worker(DYNO_OPTIMIZER_WHOLE_MODEL_COMPILE="False")

    page.goto(live_server.url + "/signin")
    page.fill("input[name=email]", "owner@acme.test")
    page.fill("input[name=password]", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")

    page.click("text=Upload a model")
    page.fill("input[name=name]", "browser-llama")
    folder = sample_models["llama"]
    page.set_input_files("#files", [str(p) for p in sorted(folder.iterdir())])
    # The list is drawn by the page's change handler: waited for, not read at once.
    expect(page.locator("#chosen li")).to_have_count(len(list(folder.iterdir())))
    page.click("#upload-submit")
    page.wait_for_url("**/versions/*")
    assert "llama" in page.inner_text("dl.kv")

    page.select_option("#hardware", "cpu")
    page.click("#start-run")
    page.wait_for_url("**/runs/*")
    # Polled by Playwright's own selectors: the page's CSP forbids the eval a string predicate needs.
    expect(page.locator("#run-status")).to_have_text("succeeded", timeout=300_000)
    page.wait_for_selector("#inventory table.inventory")  # the page reloads with the results
    assert page.locator("#inventory table.inventory tr").count() > 3
    assert "gemm" in page.inner_text("#inventory")
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)


def test_it_shows_a_refused_upload_with_its_reason(browser_page, live_server, make_org, tmp_path, media_root):
    page = browser_page
    make_org("acme", owner="owner@acme.test")
    page.goto(live_server.url + "/signin")
    page.fill("input[name=email]", "owner@acme.test")
    page.fill("input[name=password]", "correct-horse-battery")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")
    pickled = tmp_path / "pytorch_model.bin"
    pickled.write_bytes(b"\x80\x04K\x01.")
    page.goto(live_server.url + "/models/upload")
    page.fill("input[name=name]", "pickled")
    page.set_input_files("#files", [str(pickled)])
    page.click("#upload-submit")
    page.wait_for_selector("p.error")
    text = page.inner_text("p.error")
    assert "pickle_format" in text and "safetensors" in text
