"""The lenses' token figures: what a lens reads at each (reading point, position), as a heatmap of the top token's
probability with the token written in each cell, one lens or two side by side (the Jacobian lens beside the logit
lens). They take computed readings (:class:`rs_interp.readouts.JacobianLensReadings`,
:class:`rs_interp.readouts.LogitLensReadings`)
and compute nothing.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> toks = ri.induction_batch(1, seed=0).tokens[:, :12]
>>> readings = ri.jacobian_lens(model, toks, ri.fit_jacobian_lens(model, toks, skip_first=2, progress=False))
>>> fig = jacobian_lens_figure(readings, compare=ri.logit_lens(model, toks))
>>> [t.name for t in fig.data], list(fig.data[0].y)
(['J-lens', 'logit lens'], ['embed', 'L0', 'L1'])
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["jacobian_lens_figure"]


def _grid(readings: Any, batch: int, positions: list[int], decode: Callable[[int], str]) -> tuple:
    """(top-1 probabilities, their tokens, the hover text) per (reading point, position)."""
    probs = readings.top_probs[:, batch][:, positions]
    ids = readings.top_tokens[:, batch][:, positions]
    z = probs[..., 0].double().tolist()
    text = [[decode(int(i)) for i in row] for row in ids[..., 0]]
    hover = [[", ".join(f"{decode(int(i))!r} {float(p):.3f}" for i, p in zip(ids[a, b], probs[a, b]))
              for b in range(len(positions))] for a in range(ids.shape[0])]
    return z, text, hover


def jacobian_lens_figure(readings: Any, *, compare: Any = None, decode: Callable[[int], str] | None = None,
                         batch: int = 0, positions: Sequence[int] | None = None, tokens: Sequence[str] | None = None,
                         title: str | None = None) -> go.Figure:
    """Reading point x position: the colour is the top token's probability, the text the token (``decode`` maps an
    id to text, e.g. ``model.to_single_str_token``; ids by default), the hover every top token kept. With ``compare``
    (another lens's readings of the same tokens, e.g. :func:`rs_interp.logit_lens`'s) the two side by side, the
    first labelled "J-lens" and the second "logit lens" (by their types).

    Args:
        readings: a :class:`rs_interp.readouts.JacobianLensReadings` or :class:`rs_interp.readouts.LogitLensReadings`.
        compare: a second readings to show beside it.
        decode: token id -> text.
        batch: the sequence shown.
        positions: the positions shown (default every one).
        tokens: the input tokens' text, one per position shown, for the x axis.
        title: the figure's title.
    """
    decode = decode or str
    n = readings.top_tokens.shape[2]
    positions = list(range(n)) if positions is None else [p % n for p in positions]
    x = list(tokens) if tokens is not None else [str(p) for p in positions]
    panels = [readings] + ([] if compare is None else [compare])
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=False, horizontal_spacing=0.08,
                        subplot_titles=[_name(r) for r in panels])
    for col, r in enumerate(panels, start=1):
        z, text, hover = _grid(r, batch, positions, decode)
        fig.add_trace(go.Heatmap(z=z, x=x, y=list(r.labels), text=text, texttemplate="%{text}", customdata=hover,
                                 zmin=0, zmax=1, colorscale="Blues", name=_name(r), showscale=col == len(panels),
                                 colorbar=dict(title="p(top)"),
                                 hovertemplate="%{y} at %{x}: %{customdata}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(autorange="reversed", title="reading point" if col == 1 else None, row=1, col=col)
        fig.update_xaxes(title="position", row=1, col=col)
    height = 140 + 36 * max(len(r.labels) for r in panels)
    fig.update_layout(title=title or "What the lens reads: the top token at each reading point", height=height,
                      width=None)
    return fig


def _name(readings: Any) -> str:
    return "J-lens" if hasattr(readings, "transported") else "logit lens"
