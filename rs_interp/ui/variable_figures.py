"""Figures of causal variables and head subspace affinities (``rs_interp.variables``, :func:`rs_interp.head_affinity`),
beside :mod:`rs_interp.ui.plots`' composition-score figure: each a ``plotly.graph_objects.Figure`` drawn from
computed results, never shown by the library.

>>> import rs_interp as ri
>>> type(affinity_heatmaps(ri.head_affinity(ri.load_toy_model(), "k"))).__name__
'Figure'
"""

from __future__ import annotations

import math
from typing import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..labels import head_labels

__all__ = ["affinity_heatmaps", "interchange_figure"]


def affinity_heatmaps(results) -> go.Figure:
    """Head subspace affinities of every (earlier head, later head) pair, one panel per
    :class:`~rs_interp.heads.HeadAffinity` (one, several, or :func:`rs_interp.head_affinities`' mapping), as the
    composition scores' figure: the normalized projection kernel (0 orthogonal, 1 the same subspace), the
    random-subspace mean in each title.

    >>> import rs_interp as ri
    >>> fig = affinity_heatmaps(ri.head_affinities(ri.load_toy_model()))
    >>> [a.text.split(" (")[0] for a in fig.layout.annotations]
    ['OQ affinity', 'OK affinity', 'OV affinity']
    """
    if isinstance(results, Mapping):
        results = list(results.values())
    elif hasattr(results, "scores"):
        results = [results]
    if not results:
        raise ValueError("results is empty; pass at least one HeadAffinity")
    fig = make_subplots(rows=1, cols=len(results), horizontal_spacing=0.1, subplot_titles=[r.which for r in results])
    for c, r in enumerate(results, start=1):
        L, H, _, Ht = r.normalized.shape
        z = [[None if math.isnan(v) else v for v in row] for row in r.normalized.reshape(L * H, L * Ht).tolist()]
        targets = list(dict.fromkeys(t for _, t in r.labels))
        fig.add_trace(go.Heatmap(z=z, x=targets, y=list(head_labels(L, H)), zmin=0, zmax=1, colorscale="Viridis",
                                 showscale=c == len(results),
                                 hovertemplate="src %{y} -> dst %{x}: %{z:.3f}<extra></extra>"), row=1, col=c)
        chance = r.reference.mean / r.rank
        fig.layout.annotations[c - 1].text = f"O{r.which.upper()} affinity (random subspaces: {chance:.3f})"
        fig.update_xaxes(title_text="later head", row=1, col=c)
        fig.update_yaxes(title_text="earlier head" if c == 1 else None, autorange="reversed", row=1, col=c)
    fig.update_layout(title="Head subspace affinities, normalized projection kernel (empty: not later)", height=430)
    return fig


def interchange_figure(rows: Mapping[str, Mapping[str, float]], *, title: str = "Interchange accuracy") -> go.Figure:
    """Grouped bars of accuracies: one group per row (a variable, a site ...), one bar per series (``"at the
    layer it is written"``, ``"a layer before"``, ``"no intervention"`` ...).

    >>> fig = interchange_figure({"hist_1": {"written": 1.0, "before": 0.27}})
    >>> [t.name for t in fig.data]
    ['written', 'before']
    """
    if not rows:
        raise ValueError("rows is empty")
    series = list(dict.fromkeys(k for row in rows.values() for k in row))
    fig = go.Figure([go.Bar(name=s, x=list(rows), y=[rows[r].get(s) for r in rows],
                            hovertemplate="%{x}: %{y:.3f}<extra>" + s + "</extra>") for s in series])
    fig.update_layout(barmode="group", title=title, yaxis=dict(title="accuracy", range=[0, 1.05]), height=420,
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0))
    return fig
