"""The main job's report: written offline, every section present, and drawn in a real browser."""

import contextlib
import io
import json
import re

import pytest

from rs_interp.ui.cli import main
from tests.browser import ALL_DRAWN, DRAWN, offline_page, remote

# Each registry entry and the tables it builds: a section added to the registry but not here fails below.
PARTS = {"induction": ["induction"], "circuits": ["key_ablation", "heads", "composition"], "ablation": ["ablation"],
         "attribution_patching": ["attribution_patching"], "faithfulness": ["faithfulness"], "ground_truth": ["ground_truth"],
         "paths": ["paths", "logit_lens", "propositions"],
         "gpt2": ["gpt2"], "geometry": ["geometry"], "finance": ["finance"], "code": ["code", "code_lens", "code_patching"], "features": ["features"]}
SECTIONS = [key for keys in PARTS.values() for key in keys]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, train_cache):
    out = tmp_path_factory.mktemp("report")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["reproduce", "--out", str(out), "--quiet", "--cache", str(train_cache.root)])
    # the rows outside their band, if any, are in what it printed
    lines = printed.getvalue().splitlines()
    outside = [i for i, line in enumerate(lines) if "OUTSIDE" in line or "outside their band" in line]
    assert rc == 0, "\n".join("\n".join(lines[max(0, i - 3): i + 1]) for i in outside)[-6000:]
    (out / "printed.txt").write_text(printed.getvalue())
    return out


@pytest.mark.slow
def test_the_printed_tables_fit_100_characters(report_dir):
    """Issue 42: the tables and their notes wrap at 100 characters (they ran to ~240), and no value
    prints as -0."""
    from rs_interp.reproduce.report import WIDTH

    lines = (report_dir / "printed.txt").read_text().splitlines()
    assert sum(line.startswith("== ") for line in lines) >= len(SECTIONS)
    # the first line: the environment, one line; "wrote ...": the user's output paths, as long as they are
    assert [line for line in lines[1:] if len(line) > WIDTH and not line.startswith("wrote ")] == []
    assert not any(re.search(r"(?<![\w.])-0(?![.\de])", line) for line in lines if not line.startswith("rs-interp reproduce"))


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


def pairwise_auroc(scores, labels):
    """Every (positive, negative) pair: 1 if the positive scores higher, 1/2 if tied."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg) / (len(pos) * len(neg))


@pytest.mark.slow
def test_ground_truth_aurocs_are_the_written_scores(report_dir):
    """The ground-truth section's AUROCs, recomputed from the scores and edge sets it wrote
    (|score|, the noise floor, a pairwise count): what the table says is what the scores say."""
    from rs_interp.circuits.ground_truth import NOISE_FLOOR

    data = json.loads((report_dir / "results.json").read_text())["ground_truth"]
    models = [k for k in data if isinstance(data[k], dict)]
    assert set(models) == {"tracr-reverse", "tracr-sort", "tracr-hist", "tracr-frac_prevs", "tracr-at_least_half", "induction-2l"}
    for name in models:
        r = data[name]
        known, effective = set(r["known"]), set(r["effective"])
        heads_known = {e.split(" -> ")[0] for e in known}
        heads_effective = {e.split(" -> ")[0] for e in effective}
        assert effective <= known and set(r["inert"]) == known - effective
        for method, scores in r["scores"].items():
            items = list(scores)
            is_known, is_eff = (known, effective) if " -> " in items[0] else (heads_known, heads_effective)
            top = max(abs(v) for v in scores.values())
            mags = [abs(v) if abs(v) > NOISE_FLOOR * top else 0.0 for v in scores.values()]
            for key, positive, keep in (("known", is_known, items), ("effective", is_eff, [i for i in items if i in is_eff or i not in is_known])):
                labels = [i in positive for i in keep]
                kept = [m for i, m in zip(items, mags) if i in keep]
                want = pairwise_auroc(kept, labels) if 0 < sum(labels) < len(labels) else None
                assert r["auroc"][method][key] == pytest.approx(want, abs=1e-12), (name, method, key)
        if name.startswith("tracr-"):  # the known circuit carries everything: it alone is the whole model
            assert r["faithfulness"]["known"] == pytest.approx(1.0, abs=1e-9)
            assert r["auroc"]["exact path patching"]["effective"] == 1.0
    assert data["induction-2l"]["derivation"]["best_edge"]["gain"] < data["induction-2l"]["derivation"]["thresholds"]["necessary"]


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
    with offline_page() as (page, requests, errors):
        page.goto((report_dir / "report.html").as_uri())
        page.wait_for_function(ALL_DRAWN.format(selector=".fig"), timeout=60_000)
        counts = page.evaluate(DRAWN.format(selector=".fig"))
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert len(counts) >= 8, counts
    assert all(c > 0 for c in counts), f"a figure drew no data: {counts}"
    assert remote(requests) == [], "the page made a network request"
    assert errors == [], errors
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_the_registry_is_the_one_list():
    """The CLI's --only choices, the report's order and these tests all read rs_interp.reproduce.SECTIONS."""
    from rs_interp.reproduce import SECTIONS as REGISTRY
    from rs_interp.reproduce import builder
    from rs_interp.ui.cli import build_parser

    reproduce = next(a for a in build_parser()._subparsers._group_actions[0].choices["reproduce"]._actions if a.dest == "only")
    assert list(reproduce.choices) == list(REGISTRY)
    assert list(PARTS) == list(REGISTRY), "a registered section is missing from this test's PARTS (or the order differs)"
    for name in REGISTRY:
        assert callable(builder(name)), name


@pytest.mark.slow
def test_the_report_holds_every_registered_section(report_dir):
    data = json.loads((report_dir / "results.json").read_text())
    assert data["parts"] == PARTS
