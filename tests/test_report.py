"""The main job's report: written offline, every section present, and drawn in a real browser."""

import json
import os
import shutil

import pytest

from rs_interp.cli import main

# Each registry entry and the tables it builds: a section added to the registry but not here fails below.
PARTS = {"induction": ["induction"], "circuits": ["key_ablation", "heads", "composition"], "ablation": ["ablation"],
         "attribution_patching": ["attribution_patching"], "faithfulness": ["faithfulness"], "paths": ["paths", "logit_lens", "propositions"],
         "gpt2": ["gpt2"], "geometry": ["geometry"], "finance": ["finance"], "code": ["code", "code_lens", "code_patching"]}
SECTIONS = [key for keys in PARTS.values() for key in keys]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, train_cache):
    out = tmp_path_factory.mktemp("report")
    assert main(["reproduce", "--out", str(out), "--quiet", "--cache", str(train_cache.root)]) == 0
    return out


@pytest.mark.slow
def test_results_json_has_every_section_within_band(report_dir):
    data = json.loads((report_dir / "results.json").read_text())
    assert set(SECTIONS) <= set(data)
    outside = [(k, r["measure"], r["value"]) for k, rows in data["bands"].items() for r in rows if r["ok"] is False]
    assert outside == []
    assert data["paths"]["n_paths"] == 9 and len(data["logit_lens"]["p_correct"]) == 3
    assert data["gpt2"]["parameters"]["total"] == 124_439_808 and data["gpt2"]["weights"] in ("pretrained", "random")
    assert {"seen", "unseen", "n_queries"} <= set(data["finance"])
    assert len(data["geometry"]["gradient_table"]) == 3


@pytest.mark.slow
def test_report_is_self_contained(report_dir):
    html = (report_dir / "report.html").read_text()
    for key in SECTIONS:
        assert f'id="{key}"' in html
    assert html.count("<script>") == 2  # plotly.js once, then the figures
    for marker in ("https://", "http://", "cdn.", "<link", "src="):
        assert marker not in html.split("<script>")[0]  # nothing fetched by the page's head or body
    assert "✓ within band" in html or "&#10003; within band" in html


@pytest.mark.slow
def test_report_renders_in_headless_chromium(report_dir, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: scripts/setup_browser.sh should have installed Debian's package")
        pytest.skip("needs Debian's chromium package (bash scripts/setup_browser.sh installs it as root)")
    from playwright.sync_api import sync_playwright

    requests, errors = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto((report_dir / "report.html").as_uri())
            page.wait_for_function(
                "[...document.querySelectorAll('.fig')].every(d => d.querySelector('svg.main-svg'))", timeout=60_000)
            counts = page.evaluate(
                "[...document.querySelectorAll('.fig')].map(d => d.querySelectorAll("
                "'.scatterlayer .trace, .heatmaplayer image, .barlayer .point, .gl-container canvas, .scene').length)")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert len(counts) >= 8, counts
    assert all(c > 0 for c in counts), f"a figure drew no data: {counts}"
    assert [u for u in requests if not u.startswith("file://")] == [], "the page made a network request"
    assert errors == [], errors
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_the_registry_is_the_one_list():
    """The CLI's --only choices, the report's order and these tests all read rs_interp.reproduce.SECTIONS."""
    from rs_interp.cli import build_parser
    from rs_interp.reproduce import SECTIONS as REGISTRY, builder

    reproduce = next(a for a in build_parser()._subparsers._group_actions[0].choices["reproduce"]._actions if a.dest == "only")
    assert list(reproduce.choices) == list(REGISTRY)
    assert list(PARTS) == list(REGISTRY), "a registered section is missing from this test's PARTS (or the order differs)"
    for name in REGISTRY:
        assert callable(builder(name)), name


@pytest.mark.slow
def test_the_report_holds_every_registered_section(report_dir):
    data = json.loads((report_dir / "results.json").read_text())
    assert data["parts"] == PARTS
