"""A headless Chromium for the report's tests: Debian's ``chromium`` and ``chromium-driver`` (.ci/chromium.sh
installs them), driven by selenium through the system's chromedriver: nothing is downloaded, no network is
reached (the flags keep a closed machine's Chromium from waiting on one).

:func:`skip_reason` says why the tests cannot run here (no browser, no driver, no selenium): they skip with it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def _first(paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if Path(p).is_file()), None)


def skip_reason() -> str | None:
    """Why a browser test cannot run here; None: it can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _first(CHROMIUM) is None:
        return "no Chromium (/usr/bin/chromium): apt-get install -y chromium chromium-driver (.ci/chromium.sh)"
    if _first(CHROMEDRIVER) is None:
        return "no chromedriver (/usr/bin/chromedriver): apt-get install -y chromium-driver (.ci/chromium.sh)"
    return None


@contextmanager
def chromium() -> Iterator:
    """A selenium WebDriver of a fresh headless Chromium (its own profile folder, removed after)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="topk-bench-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = _first(CHROMIUM) or CHROMIUM[0]
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=_first(CHROMEDRIVER)))
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, page: Path, to: Path, height: int | None = None) -> None:
    """``page`` opened and its full height (or ``height`` pixels of it) saved as a PNG."""
    driver.get(page.resolve().as_uri())
    full = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height or full, 16000))
    driver.save_screenshot(str(to))
