"""The figures of causal variables and head affinities take the results the helpers return and draw them."""

from __future__ import annotations

import pytest

import rs_interp as ri
from rs_interp.ui import variable_figures as figures


def test_affinity_heatmaps_draw_the_normalized_kernels():
    model = ri.load_toy_model("induction-2l")
    aff = ri.head_affinities(model)
    fig = figures.affinity_heatmaps(aff)
    assert len(fig.data) == 3 and list(fig.data[0].z[0])[2] == pytest.approx(float(aff["q"].normalized[0, 0, 1, 0]))
    assert fig.data[0].z[0][0] is None  # no later head in the same layer
    assert figures.affinity_heatmaps(aff["v"]).layout.annotations[0].text.startswith("OV affinity")
    with pytest.raises(ValueError, match="empty"):
        figures.affinity_heatmaps([])


def test_interchange_figure_draws_each_series():
    fig = figures.interchange_figure({"hist_1": {"written": 1.0, "before": 0.3}, "sort_1": {"written": 1.0}})
    assert [t.name for t in fig.data] == ["written", "before"] and list(fig.data[1].y) == [0.3, None]
    assert list(fig.data[0].x) == ["hist_1", "sort_1"]
