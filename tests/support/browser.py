"""Headless Chromium for the UI tests (Debian's chromium and chromium-driver, which
scripts/setup.sh installs; never a browser download)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


@contextmanager
def headless_chromium(width: int, height: int) -> Iterator[webdriver.Chrome]:
    """A Chromium WebDriver with a fresh profile (no stored UI choices), quit and its profile
    removed on exit."""
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver_bin, "install Debian's chromium and chromium-driver (scripts/setup.sh does)"
    profile = tempfile.mkdtemp(prefix="mltrace-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
