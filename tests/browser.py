"""The pages rs_interp writes (the report, the circuit command's page, the docs site), opened offline in
headless Chromium: one launcher for the three tests that draw them."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Iterator

import pytest

#: How many marks each figure drew (a plotly trace, heatmap image, bar, WebGL canvas or 3-D scene), per
#: figure container matched by the selector given.
DRAWN = ("[...document.querySelectorAll('{selector}')].map(d => d.querySelectorAll("
         "'.scatterlayer .trace, .heatmaplayer image, .barlayer .point, .gl-container canvas, .scene').length)")
#: True once every figure container matched by the selector holds plotly's drawing.
ALL_DRAWN = "[...document.querySelectorAll('{selector}')].every(d => d.querySelector('svg.main-svg'))"


def chromium() -> str:
    """Debian's chromium, or a skip (a failure in CI, where scripts/setup_browser.sh installs it)."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: scripts/setup_browser.sh should have installed Debian's package")
        pytest.skip("needs Debian's chromium package (bash scripts/setup_browser.sh installs it as root)")
    return path


@contextlib.contextmanager
def offline_page() -> Iterator[tuple[object, list[str], list[str]]]:
    """``(page, requests, errors)``: a 1280 px page in headless Chromium with no network services, every
    request it makes recorded in ``requests`` and every page error or console error in ``errors``."""
    from playwright.sync_api import sync_playwright

    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
            page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
            yield page, requests, errors
        finally:
            browser.close()


def remote(requests: list[str]) -> list[str]:
    """The requests that left the machine (anything but file://, data: and blob: URLs)."""
    return [u for u in requests if not u.startswith(("file://", "data:", "blob:"))]
