"""The fleet console in a real browser (Debian's chromium, driven by selenium through
chromium-driver): the page loads behind its credential, shows the halted rollout and the down
node, and the down node's row is one click away. The credential goes in the URL
(``http://operator:SECRET@host/console/``): Chromium answers the console's Basic challenge with
it for the top-level page and keeps it for the links followed from there, so the console needs
no login form and no cookie. ``CONSOLE_SCREENSHOT=PATH`` also writes the screenshot there
(docs/console.png is made so)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import fleet_state
from harness.processes import TierProcess, start_console

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("chromedriver") is None or
                                 shutil.which("chromium") is None,
                                 reason="needs Debian's chromium and chromium-driver")]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[tuple[TierProcess, str]]:
    fleet_state.build(tmp_path / "registry", 60)
    server = start_console(tmp_path / "registry", tmp_path, tmp_path / "secret",
                           "--consul-ui", "http://127.0.0.1:8500/ui",
                           "--prometheus", "http://127.0.0.1:9090")
    try:
        yield server, (tmp_path / "secret").read_text().strip()
    finally:
        server.stop()


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--window-size=1400,1050", "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options,
                              service=Service(shutil.which("chromedriver") or ""))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_console_loads_in_chromium_with_the_halted_rollout_and_the_down_node(
        console: tuple[TierProcess, str], browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver

    assert isinstance(browser, WebDriver)
    server, secret = console
    browser.get(f"http://127.0.0.1:{server.port}/console/")  # no credential: refused
    assert "sentiment" not in browser.page_source
    browser.get(f"http://operator:{secret}@127.0.0.1:{server.port}/console/")
    assert browser.title == "Tiered fleet console"
    halted = browser.find_element(By.CSS_SELECTOR, ".rollout h3 .halted")
    assert halted.text == "halted"
    assert halted.value_of_css_property("background-color") == "rgba(251, 213, 213, 1)"
    assert "sentiment version 2 (from 1): halted at wave 1/3" in browser.find_element(
        By.CSS_SELECTOR, ".rollout h3").text
    down = browser.find_element(By.CSS_SELECTOR, "#totals a.down")
    assert down.text == "1 disconnected"
    shot = tmp_path / "console.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    if os.environ.get("CONSOLE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["CONSOLE_SCREENSHOT"])
    down.click()  # the credential is kept for the links followed
    rows = browser.find_elements(By.CSS_SELECTOR, "#nodes tr.node")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == ["edge-03"]
    assert rows[0].find_element(By.CSS_SELECTOR, "td.down").text == "disconnected"
