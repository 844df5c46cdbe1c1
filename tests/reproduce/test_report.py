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
    models = [k for k in data if isinstance(data[k], dict) and k != "goal"]  # issue 66's goal: gaps, not a model
    assert set(models) == {"tracr-reverse", "tracr-sort", "tracr-hist", "tracr-frac_prevs", "tracr-at_least_half", "induction-2l"}
    for name in models:
        r = data[name]
        known, effective = set(r["known"]), set(r["effective"])
        heads_known = {e.split(" -> ")[0] for e in known}
        heads_effective = {e.split(" -> ")[0] for e in effective}
        assert effective <= known and set(r["inert"]) == known - effective
        for method, scores in r["scores"].items():
            items = [i.split(" @ ")[0] for i in scores]  # a positional edge ("s -> r @ span") is known when its edge is
            is_known, is_eff = (known, effective) if " -> " in items[0] else (heads_known, heads_effective)
            top = max(abs(v) for v in scores.values())
            mags = [abs(v) if abs(v) > NOISE_FLOOR * top else 0.0 for v in scores.values()]
            for key, positive, keeps in (("known", is_known, lambda i: True), ("effective", is_eff, lambda i: i in is_eff or i not in is_known)):
                labels = [i in positive for i in items if keeps(i)]
                kept = [m for i, m in zip(items, mags) if keeps(i)]
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


def _theory_value(text: str) -> bool:
    """A theory cell holds a value: numbers, bounds, exact ratios, a quoted token, True or False, ``-``; no word
    (issue 61: cost ratios like "1.85 x EAP" and words like "lower is better" were in it)."""
    bare = re.sub(r"'[^']*'|\bTrue\b|\bFalse\b|\d+(\.\d+)?e[-+]?\d+", "", text)
    return not re.search(r"[A-Za-z]{2,}", bare)


def test_the_page_opens_with_the_theory_and_folds_the_unbanded_rows(tmp_path):
    """Issue 61: report.html opens with what it reproduces, from which theory (its title, a link to the docs' map of
    the theory's parts to the sections) and how to read a band; a table shows its banded rows and folds the rest
    (<details>), each row's note in its own column; a section's files are linked."""
    import html as html_module

    from rs_interp.reproduce.context import Row, Section
    from rs_interp.reproduce.report import THEORY, docs_map_link, write_report

    rows = (Row("judged", 1.0, "1", "<= 2", True), Row("reported", 2.0, "-", "report", None, note="1.85 x EAP's"),
            Row("also reported", 3.0, "0.5", "report", None), Row("judged too", 4.0, "-", ">= 5", False))
    section = Section("s", "A section", rows, {}, files={"graph.json": {"links": []}})
    page = write_report([section], tmp_path / "report.html", docs_link="map.html#where").read_text()
    opening = page.split('<section id="s">')[0]
    assert f"<title>{THEORY}: reproduced by rs_interp</title>" in page and f"<em>{THEORY}</em>" in opening
    assert '<a href="map.html#where">the map of its parts to these sections</a>' in opening
    assert "How to read a row" in opening and "within band" in opening and "outside" in opening
    body = page.split('<section id="s">')[1].split("</section>")[0]
    shown, folded = body.split("<details>")
    assert "judged" in shown and "judged too" in shown and "reported" not in shown.split("</tr>", 1)[1]
    assert "<summary>2 rows reported without a band</summary>" in folded
    assert "also reported" in folded and "<td class='beside'>1.85 x EAP&#x27;s</td>" in folded
    assert '<a href="graph.json">graph.json</a>' in body
    link = docs_map_link()  # this clone has the docs: the built page or its Markdown source
    assert link is not None and link.startswith("file://") and "reproduction" in link
    assert html_module.escape(link) in write_report([section], tmp_path / "again.html").read_text()


def test_every_expected_theory_is_a_value():
    from rs_interp.reproduce.expected import EXPECTED

    assert [k for k, e in EXPECTED.items() if not _theory_value(e.theory)] == []
    assert not _theory_value("1.85 x EAP") and not _theory_value("lower is better") and _theory_value("' Paris'")
    assert _theory_value("(1 + 2/13) / 2 = 0.5769") and _theory_value("5.4e-9 (1.07e-8 / 1.997)")
    assert _theory_value("True")


@pytest.mark.slow
def test_the_report_holds_only_theory_values_and_folds_the_unbanded_rows(report_dir):
    data = json.loads((report_dir / "results.json").read_text())
    assert [(k, r["measure"], r["theory"]) for k, rows in data["bands"].items() for r in rows
            if not _theory_value(r["theory"])] == []
    page = (report_dir / "report.html").read_text()
    discovery = page.split('<section id="faithfulness">')[1].split("</section>")[0]
    unbanded = sum(r["ok"] is None for r in data["bands"]["faithfulness"])
    # 219 rows, 211 without a band: the circuit of every edge per model, and each positional method's sum over spans
    assert len(data["bands"]["faithfulness"]) - unbanded <= 8 and unbanded > 100
    assert f"<summary>{unbanded} rows reported without a band</summary>" in discovery
    assert discovery.split("<details>")[0].count("<tr>") == len(data["bands"]["faithfulness"]) - unbanded + 1


@pytest.mark.slow
def test_the_feature_graph_is_beside_the_report_in_circuit_tracers_format(report_dir):
    """Issue 61: the main job writes its feature graph beside report.html as circuit-tracer's graph JSON, links
    included, with the index circuit-tracer's local server reads (its frontend fetches ./data/graph-metadata.json and
    ./graph_data/{slug}.json from the folder): the fields and types of circuit-tracer's own pydantic models
    (circuit_tracer/frontend/graph_models.py: Metadata, QParams, Node, Link, Model), every link between two nodes."""
    from rs_interp.reproduce.sections.features import GRAPH_SLUG

    data = json.loads((report_dir / f"{GRAPH_SLUG}.json").read_text())
    index = json.loads((report_dir / "graph-metadata.json").read_text())
    assert index == {"graphs": [data["metadata"]]} and data["metadata"]["slug"] == GRAPH_SLUG
    types = {"metadata": {"slug": str, "scan": str, "transcoder_list": list, "prompt_tokens": list, "prompt": str,
                          "node_threshold": float, "schema_version": int},
             "qParams": {"pinnedIds": list, "supernodes": list, "linkType": str, "clickedId": str, "sg_pos": str}}
    for part, fields in types.items():
        assert {k: type(data[part][k]) for k in fields} == fields
    node = {"node_id": str, "feature": int, "layer": str, "ctx_idx": int, "feature_type": str, "token_prob": float,
            "is_target_logit": bool, "run_idx": int, "reverse_ctx_idx": int, "jsNodeId": str, "clerp": str}
    assert all({k: type(n[k]) for k in node} == node for n in data["nodes"])
    ids = {n["node_id"] for n in data["nodes"]}
    assert len(ids) == len(data["nodes"]) and len(data["links"]) > 100
    assert all(set(link) == {"source", "target", "weight"} and link["source"] in ids and link["target"] in ids
               for link in data["links"])
    page = (report_dir / "report.html").read_text()
    assert f'<a href="{GRAPH_SLUG}.json">' in page and f"{len(data['links'])} links" in page


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
