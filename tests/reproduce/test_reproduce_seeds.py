"""Issue 19: every stochastic table over several seeds, with the exceptions explained."""

import json

import pytest

from rs_interp.reproduce import _merge
from rs_interp.reproduce.context import Row, Section
from rs_interp.ui.cli import main
from tests.builders import slow_on_tl3


def _section(values, oks, labels=None):
    labels = labels or ["a"] * len(values)
    return Section("s", "S", tuple(Row(lab, v, "t", "<= 1", ok) for v, ok, lab in zip(values, oks, labels)), {})


def test_merge_counts_seeds_within_band_and_keeps_each_seeds_label():
    merged = _merge((_section([0.5, 2.0], [True, False]), _section([0.7, 0.4], [True, True], ["a", "b (another head)"]),
                     _section([0.9, 5.0], [True, None])), seed=10)
    first, second = merged.rows
    assert first.value == pytest.approx(0.7) and first.within == (3, 3, 3) and first.ok is True
    assert [s for s, *_ in first.per_seed] == [10, 11, 12]
    assert second.within == (1, 2, 3) and second.ok is False  # seed 10 outside, seed 12 not judged
    assert second.per_seed[1][3] == "b (another head)"


def test_merge_refuses_tables_that_differ_across_seeds():
    with pytest.raises(RuntimeError, match="different number of rows"):
        _merge((_section([1.0], [True]), _section([1.0, 2.0], [True, True])), seed=0)


def test_seeds_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "--seeds", "0"])
    assert "at least 1" in capsys.readouterr().err


@slow_on_tl3("three full reproductions (3 min): once per CI run, in the shorter 3.x pass")
def test_three_seeds_every_banded_row_per_seed(tmp_path, capsys, train_cache):
    """N = 3 retrains every seeded piece; each banded row holds its three values and 'k of 3'."""
    only = ["induction", "circuits", "ablation", "paths", "geometry", "finance"]
    assert main(["reproduce", "--seeds", "3", "--only", *only, "--quiet", "--out", str(tmp_path),
                 "--cache", str(train_cache.root)]) == 0
    out = capsys.readouterr().out
    assert " of 3" in out
    data = json.loads((tmp_path / "results.json").read_text())
    banded = [r for rows in data["bands"].values() for r in rows if r["band"] not in ("report",)]
    assert banded and all(len(r["per_seed"]) == 3 and "within_band" in r for r in banded if r["band"] != "n/a")
    for r in banded:
        if "mean" in r:
            assert r["min"] <= r["mean"] <= r["max"]
    html = (tmp_path / "report.html").read_text()
    assert html.count('class="seed"') >= 3 * len(banded) and "over 3 seeds" in html
