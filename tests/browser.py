"""Headless Debian Chromium for the admin's browser tests (the dashboard, the charts, the
admin pages at 1366 px): one way to start it, shared by their ``browser`` fixtures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def start_chromium(tmp_path: Path, window: str = "1366,900"):
    """A selenium driver of Debian's chromium through the system chromedriver, headless,
    with a fresh profile under ``tmp_path`` and the window ``"WIDTH,HEIGHT"``. Missing,
    the test fails saying how to install them (``bin/setup`` does it when run as root):
    never a silent pass. The caller quits the driver."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.fail("Debian's chromium and chromium-driver are not installed: run `bash bin/setup` as root, or "
                    "`apt-get install chromium chromium-driver`", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--window-size={window}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path, log_output=str(tmp_path / "driver.log")),
                              options=options)
    driver.implicitly_wait(0)
    return driver
