"""The theory's geometry figures (split out of plots.py to keep it within 420 lines; plots re-exports them)."""

from __future__ import annotations

import math

from rs_interp.reproduce.geometry import collapse_cloud, collapse_run
from rs_interp.ui import plots
from rs_interp.ui.geometry_figures import collapse_figure, layernorm_figure


def test_layernorm_puts_the_cloud_on_the_circle_in_the_plane():
    after = {t.name: t for t in layernorm_figure(12, seed=1).data}["LN(cloud)"]
    for x, y, z in zip(after.x, after.y, after.z):
        assert abs(x + y + z) <= 1e-12 and abs(math.sqrt(x * x + y * y + z * z) - math.sqrt(3)) <= 1e-12


def test_collapse_has_a_panel_per_beta_and_the_bound_beside_the_pure_stack_only():
    runs = [collapse_run(collapse_cloud(0), beta, skip=s) for beta in (0.5, 1.0) for s in (False, True)]
    fig = collapse_figure(runs)
    assert [t.name for t in fig.data].count("Theorem 1 bound") == 2 and len(fig.data) == 6
    assert plots.collapse_figure is collapse_figure and plots.layernorm_figure is layernorm_figure
