"""The theory's geometry figures: attention's collapse layer by layer (with and without the skip) and
LayerNorm at d = 3. They take computed runs and compute nothing more than the picture.

>>> from rs_interp.reproduce.geometry import collapse_cloud, collapse_run
>>> runs = [collapse_run(collapse_cloud(0), 1.0, skip=s) for s in (False, True)]
>>> [t.name for t in collapse_figure(runs).data]
['pure attention', 'Theorem 1 bound', 'with the skip']
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

__all__ = ["collapse_figure", "layernorm_figure"]


def collapse_figure(runs: Sequence) -> go.Figure:
    """Diameter per layer, pure stack vs skip, with Theorem 1 (iii)'s bound, one panel per beta (log scale)."""
    betas = sorted({r.beta for r in runs})
    fig = make_subplots(rows=1, cols=len(betas), subplot_titles=[f"β = {b:g}" for b in betas], horizontal_spacing=0.05)
    style = {False: ("pure attention", "#d62728"), True: ("with the skip", "#1f77b4")}
    for c, beta in enumerate(betas, start=1):
        for run in (r for r in runs if r.beta == beta):
            name, color = style[run.skip]
            layers = list(range(len(run.diameter)))
            fig.add_trace(go.Scatter(x=layers, y=[max(float(v), 1e-16) for v in run.diameter], name=name,
                                     mode="lines+markers", line=dict(color=color), legendgroup=name,
                                     showlegend=c == 1), row=1, col=c)
            if not run.skip:
                fig.add_trace(go.Scatter(x=layers, y=[max(float(v), 1e-16) for v in run.bound],
                                         name="Theorem 1 bound", line=dict(color="#555", dash="dash"),
                                         legendgroup="bound", showlegend=c == 1), row=1, col=c)
        fig.update_xaxes(title_text="layer", row=1, col=c)
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_yaxes(title_text="diameter (log; 0 drawn at 1e-16)", row=1, col=1)
    fig.update_layout(title="Attention collapses; the skip keeps the diameter", height=420)
    return fig


def layernorm_figure(n_points: int = 40, *, seed: int = 0) -> go.Figure:
    """LayerNorm at d = 3: the plane x + y + z = 0, the circle of radius sqrt(3), a cloud before and after."""
    from ..exact.norm import Norm  # LayerNorm with gain 1, bias 0, no epsilon (LNPre): Definition 3

    g = torch.Generator().manual_seed(seed)
    scale, shift = (torch.tensor([1.5, 0.7, 0.4], dtype=torch.float64),
                    torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64))
    cloud = torch.randn(n_points, 3, generator=g, dtype=torch.float64) * scale + shift
    after = Norm("LNPre").apply(cloud)
    e1 = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64) / math.sqrt(2)
    e2 = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64) / math.sqrt(6)
    t = torch.linspace(0, 2 * math.pi, 120, dtype=torch.float64)
    circle = math.sqrt(3) * (torch.cos(t)[:, None] * e1 + torch.sin(t)[:, None] * e2)
    s = torch.linspace(-3, 3, 2, dtype=torch.float64)
    grid = s[:, None, None] * e1 + s[None, :, None] * e2
    fig = go.Figure()
    fig.add_trace(go.Surface(x=grid[..., 0].tolist(), y=grid[..., 1].tolist(), z=grid[..., 2].tolist(), opacity=0.25,
                             showscale=False, colorscale=[[0, "#9ecae1"], [1, "#9ecae1"]], name="plane x+y+z=0",
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter3d(x=circle[:, 0].tolist(), y=circle[:, 1].tolist(), z=circle[:, 2].tolist(), mode="lines",
                               line=dict(color="#1f77b4", width=5), name="circle of radius √3"))
    for pts, name, color in ((cloud, "a cloud", "#ff7f0e"), (after, "LN(cloud)", "#2ca02c")):
        fig.add_trace(go.Scatter3d(x=pts[:, 0].tolist(), y=pts[:, 1].tolist(), z=pts[:, 2].tolist(), mode="markers",
                                   marker=dict(size=3, color=color), name=name))
    fig.update_layout(title="LayerNorm is a sphere in a hyperplane (d = 3)", height=520, scene=dict(aspectmode="data"))
    return fig
