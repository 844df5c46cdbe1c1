"""Figures, each returned as a ``plotly.graph_objects.Figure`` (never shown by the library). They take
computed results (scores, patterns, scans) and compute nothing themselves.

>>> from rs_interp import composition_scores, load_toy_model
>>> model = load_toy_model()
>>> fig = composition_heatmaps([composition_scores(model, kind) for kind in "kqv"])
>>> type(fig).__name__
'Figure'
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..labels import head_label, head_labels
from .circuit_figure import circuit_figure
from .geometry_figures import collapse_figure, layernorm_figure
from .lens_figures import jacobian_lens_figure

__all__ = ["faithfulness_figure", "ground_truth_figure", "attention_figure", "path_contributions_figure",
           "logit_lens_figure", "jacobian_lens_figure", "composition_heatmaps", "collapse_figure", "layernorm_figure",
           "parameter_breakdown_figure", "finance_figure", "head_scan_figure", "second_order_figure",
           "estimate_vs_exact_figure", "period_sequence", "position_figure", "circuit_figure"]


def period_sequence(period: int = 11, *, seed: int = 0, d_vocab: int = 256, seq_len: int = 48) -> torch.Tensor:
    """One test sequence (1, seq_len) of the given period, seeded."""
    from ..models.data import induction_batch

    return induction_batch(1, seed=seed, d_vocab=d_vocab, seq_len=seq_len, min_period=period, max_period=period).tokens


def attention_figure(patterns: torch.Tensor, heads: Sequence[tuple[int, int]], *,
                     period: int | None = None) -> go.Figure:
    """Attention patterns of ``heads`` on one sequence, from ``patterns`` (layer, head, query, key), e.g.
    ``rs_interp.attention_patterns(model, tokens)[:, 0]``; with ``period``, the induction target ``i - p + 1`` is
    outlined.

    >>> from rs_interp import load_toy_model, attention_patterns
    >>> pat = attention_patterns(load_toy_model(), period_sequence(11))[:, 0]
    >>> len(attention_figure(pat, [(0, 0), (1, 0)], period=11).data) >= 2
    True
    """
    pat = patterns
    fig = make_subplots(rows=1, cols=len(heads), subplot_titles=[f"head {head_label(l, h)}" for l, h in heads],
                        horizontal_spacing=0.08)
    n = pat.shape[-1]
    for c, (l, h) in enumerate(heads, start=1):
        fig.add_trace(go.Heatmap(z=pat[l, h].tolist(), colorscale="Blues", zmin=0, zmax=1, showscale=c == len(heads),
                                 hovertemplate="query %{y}, key %{x}: %{z:.3f}<extra></extra>"), row=1, col=c)
        if period is not None:
            qs = list(range(period, n))
            fig.add_trace(go.Scatter(x=[q - period + 1 for q in qs], y=qs, mode="markers",
                                     name="induction target i-p+1",
                                     marker=dict(symbol="square-open", size=7, color="#d62728"), showlegend=c == 1),
                          row=1, col=c)
        fig.update_yaxes(autorange="reversed", title_text="query position i" if c == 1 else None, row=1, col=c)
        fig.update_xaxes(title_text="key position j", row=1, col=c)
    fig.update_layout(title="Attention patterns" + (f" on a sequence of period {period}" if period else ""), height=500,
                      legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
    return fig


def path_contributions_figure(labels, contributions: Sequence[float] | None = None, *,
                              title: str = "The correct token's logit, split into paths") -> go.Figure:
    """Bars of each path's (or component's) part of a logit: a :class:`~rs_interp.readouts.PathAttribution`, a
    :class:`~rs_interp.readouts.DirectLogitAttribution` (each component's mean part), or ``labels`` and
    ``contributions``.

    >>> import rs_interp as ri
    >>> b = ri.induction_batch(8, seed=0)
    >>> fig = path_contributions_figure(ri.path_logit_attribution(ri.load_toy_model(), b.tokens, targets=b.targets))
    >>> len(fig.data[0].x) > 3
    True
    """
    if contributions is None:
        result = labels
        labels = list(result.labels)
        if hasattr(result, "centered"):  # PathAttribution: each path's mean part of the centred logit
            contributions = result.centered.mean(-1).tolist()
        elif hasattr(result, "mean"):  # DirectLogitAttribution
            contributions = result.mean().tolist()
        else:
            raise ValueError("path_contributions_figure takes a PathAttribution, a DirectLogitAttribution, or labels "
                             f"and contributions; got {type(result).__name__}")
    vals = [float(v) for v in contributions]
    colors = ["#1f77b4" if v >= 0 else "#d62728" for v in vals]
    fig = go.Figure(go.Bar(x=list(labels), y=vals, marker_color=colors, hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    fig.add_hline(y=0, line_color="#444")
    fig.update_layout(title=f"{title} (total {sum(vals):.2f})", xaxis_title="path", yaxis_title="logit contribution",
                      height=420)
    return fig


def logit_lens_figure(labels, probs: Mapping[str, Sequence[float]] | None = None, *, chance: float | None = None,
                      title: str = "Logit lens") -> go.Figure:
    """The probability of the correct token at every reading point: a :class:`~rs_interp.readouts.LogitLensReadings`
    (its mean target probability over the positions with a target), or ``labels`` and ``probs`` (series name -> one
    value per reading point). Every series is named in the legend, a single one too.

    >>> import rs_interp as ri
    >>> b = ri.induction_batch(4, seed=0)
    >>> fig = logit_lens_figure(ri.logit_lens(ri.load_toy_model(), b.tokens, targets=b.targets))
    >>> list(fig.data[0].x), fig.layout.showlegend
    (['embed', 'L0', 'L1'], True)
    """
    if probs is None:
        readings = labels
        if getattr(readings, "target_probs", None) is None:
            raise ValueError("logit_lens_figure needs the lens read with targets= (its target probabilities), "
                             "or labels and probs")
        labels = list(readings.labels)
        p = readings.target_probs.to(torch.float64)
        probs = {"p(target)": p.nanmean(dim=(1, 2)).tolist()}
    fig = go.Figure()
    for name, ys in probs.items():
        fig.add_trace(go.Scatter(x=list(labels), y=[float(y) for y in ys], mode="lines+markers", name=name))
    if chance is not None:
        fig.add_hline(y=chance, line_dash="dot", line_color="#888", annotation_text="chance")
    fig.update_layout(title=title, xaxis_title="reading point", yaxis_title="probability of the correct token",
                      height=380, showlegend=True)
    return fig


def composition_heatmaps(results) -> go.Figure:
    """Composition scores of every (earlier head, later head) pair, one panel per
    :class:`~rs_interp.heads.CompositionScores` (one, or several: e.g. one per kind, ``"k"``, ``"q"``, ``"v"``); a
    result's random baseline goes in its title when it has one."""
    if hasattr(results, "scores"):
        results = [results]
    if not results:
        raise ValueError("results is empty; pass at least one CompositionScores")
    by_kind = {r.which: r for r in results}
    kinds = list(by_kind)
    L, H = results[0].scores.shape[:2]
    fig = make_subplots(rows=1, cols=len(kinds), horizontal_spacing=0.1, subplot_titles=kinds)
    mats = {k: by_kind[k].scores.reshape(L * H, L * H) for k in kinds}
    baselines = {k: r.baseline for k, r in by_kind.items() if r.baseline is not None}
    zmax = max(float(m.nan_to_num(0).max()) for m in mats.values())
    names = list(head_labels(L, H))  # not "0.1": plotly would read it as a number
    for c, kind in enumerate(kinds, start=1):
        z = [[None if math.isnan(v) else v for v in row] for row in mats[kind].tolist()]
        fig.add_trace(go.Heatmap(z=z, x=names, y=names, zmin=0, zmax=zmax, colorscale="Viridis",
                                 showscale=c == len(kinds),
                                 hovertemplate="src %{y} -> dst %{x}: %{z:.3f}<extra></extra>"), row=1, col=c)
        base = f" (random baseline {baselines[kind]:.3f})" if baselines and kind in baselines else ""
        fig.layout.annotations[c - 1].text = f"{kind.upper()}-composition{base}"
        fig.update_xaxes(title_text="later head", row=1, col=c)
        fig.update_yaxes(title_text="earlier head" if c == 1 else None, autorange="reversed", row=1, col=c)
    fig.update_layout(title="Composition scores (empty: the later head is not later)", height=430)
    return fig


def parameter_breakdown_figure(by_category, *, title: str = "GPT-2 small: where the parameters live") -> go.Figure:
    """One stacked horizontal bar of parameter counts per category: a :class:`~rs_interp.models.ParameterCount`
    or its ``by_category``.

    >>> import rs_interp as ri
    >>> len(parameter_breakdown_figure(ri.count_parameters(ri.models.gpt2_config("small"))).data)
    5
    """
    by_category = getattr(by_category, "by_category", by_category)
    total = sum(by_category.values())
    fig = go.Figure()
    for name, n in by_category.items():
        fig.add_trace(go.Bar(y=["GPT-2 small"], x=[n], name=f"{name} ({n:,}, {100 * n / total:.1f}%)", orientation="h",
                             hovertemplate=f"{name}: {n:,}<extra></extra>"))
    fig.update_layout(barmode="stack", title=f"{title}: {total:,}", xaxis_title="parameters", height=300)
    return fig


def finance_figure(seen, unseen: Mapping[str, float] | None = None) -> go.Figure:
    """Fraction of company-name queries completed per reader, seen vs unseen companies: a finance
    study's result (with ``seen`` and ``unseen``) or the two mappings."""
    if unseen is None:
        seen, unseen = seen.seen, seen.unseen
    readers = list(seen)
    fig = go.Figure([go.Bar(name="seen companies", x=readers, y=[seen[r] for r in readers]),
                     go.Bar(name="unseen companies", x=readers, y=[unseen[r] for r in readers])])
    fig.update_layout(barmode="group", title="Completing company names in filings", yaxis_title="fraction completed",
                      yaxis_range=[0, 1], height=420)
    return fig


def position_figure(prev_weight: Sequence[float], accuracy: Sequence[float], kernel: Sequence[float], *,
                    head: tuple[int, int], drop: int) -> go.Figure:
    """The previous-token head by query position (its weight on ``i - 1``, the model's accuracy) and its
    content-free kernel by offset, with the position ``drop`` where the weight moves (a dotted line)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"by query position (head {head_label(*head)})",
                                                        "content-free score by offset"))
    x = list(range(1, len(prev_weight) + 1))
    fig.add_trace(go.Scatter(x=x, y=list(prev_weight), name="weight on i-1", mode="lines"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=list(accuracy), name="accuracy", mode="lines"), row=1, col=1)
    fig.add_vline(x=drop, line_dash="dot", row=1, col=1)
    fig.add_trace(go.Scatter(x=list(range(len(kernel))), y=list(kernel), name="kernel", mode="lines+markers"),
                  row=1, col=2)
    fig.update_xaxes(title_text="query position i", row=1, col=1)
    fig.update_xaxes(title_text="offset Delta", row=1, col=2)
    fig.update_layout(title="The previous-token head and the kernel's next peak", height=380)
    return fig


def head_scan_figure(values, *, title: str | None = None, colorbar: str = "effect",
                     symmetric: bool = True) -> go.Figure:
    """A (layer, head) heatmap: a result with a (layer, head) ``effect`` (:class:`~rs_interp.heads.HeadAblationScan`,
    :class:`~rs_interp.circuits.AttributionPatching`) or ``induction`` (:class:`~rs_interp.heads.InductionScores`), or
    the values themselves (copying scores ...). Computes nothing; ``symmetric`` centres the colour scale on zero; the
    title defaults to the result's kind.

    >>> import rs_interp as ri
    >>> b = ri.induction_batch(8, seed=0)
    >>> fig = head_scan_figure(ri.head_ablation_scan(ri.load_toy_model(), b.tokens, ri.next_token_loss(b.targets)))
    >>> fig.layout.title.text
    'Head ablation scan (zero): change of the metric'
    """
    if not isinstance(values, torch.Tensor):
        result = values
        kind = type(result).__name__
        if hasattr(result, "effect"):
            values = result.effect
            ablation = getattr(result, "ablation", None)
            default = ("Head ablation scan" + (f" ({ablation})" if ablation else "") + ": change of the metric"
                       if kind == "HeadAblationScan" else f"{kind}: estimated change of the metric")
        elif hasattr(result, "induction"):
            values, default, symmetric, colorbar = (result.induction, "Induction scores: weight on i - p + 1",
                                                    False, "weight")
        else:
            raise ValueError("head_scan_figure takes a (layer, head) tensor or a result with effect or induction, "
                             f"got {kind}")
        title = title or default
    if values.ndim != 2:
        raise ValueError(f"head_scan_figure takes (layer, head) values, got shape {tuple(values.shape)}")
    L, H = values.shape
    z = values.double().tolist()
    zmax = float(values.abs().max()) if symmetric else None
    fig = go.Figure(go.Heatmap(z=z, x=[f"H{h}" for h in range(H)], y=[f"L{l}" for l in range(L)],
                               colorscale="RdBu_r" if symmetric else "Viridis",
                               zmid=0 if symmetric else None, zmin=-zmax if symmetric else None, zmax=zmax,
                               colorbar=dict(title=colorbar), hovertemplate="%{y}%{x}: %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="layer")
    fig.update_xaxes(title="head")
    fig.update_layout(title=title or "Heads", height=160 + 60 * L)
    return fig


def second_order_figure(sources, destinations: Sequence[str] | None = None, matrix: torch.Tensor | None = None, *,
                        title: str | None = None, batch: int = 0, position: int = -1) -> go.Figure:
    """A (source x destination) heatmap of second-order attributions at one position: a
    :class:`~rs_interp.readouts.SecondOrderAttribution` (at ``batch`` and the index ``position`` of its positions), or
    ``sources``, ``destinations`` and a matrix.

    >>> import rs_interp as ri
    >>> b = ri.induction_batch(2, seed=0)
    >>> so = ri.second_order_attribution(ri.load_toy_model(), b.tokens, targets=b.targets, positions=[-2])
    >>> second_order_figure(so).data[0].z is not None
    True
    """
    if destinations is None or matrix is None:
        result = sources
        sources, destinations, matrix = result.sources, result.destinations, result.matrix(batch, position)
        title = title or ("Second order: each head's direct part, split over its sources "
                          f"(position {result.positions[position]})")
    z = matrix.double()
    zmax = float(z.abs().max()) or 1.0
    fig = go.Figure(go.Heatmap(z=z.tolist(), x=list(destinations), y=list(sources), colorscale="RdBu_r", zmid=0,
                               zmin=-zmax, zmax=zmax, colorbar=dict(title="logit"),
                               hovertemplate="%{y} -> %{x}: %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="source (what the head read)")
    fig.update_xaxes(title="destination head")
    fig.update_layout(title=title or "Second-order attribution", height=200 + 18 * len(sources))
    return fig


def estimate_vs_exact_figure(labels, exact=None, estimate: Sequence[float] | None = None, *,
                             title: str | None = None) -> go.Figure:
    """Scatter of an estimate against the exact effect, with y = x: two results of the same items
    (``estimate_vs_exact_figure(estimate, exact)``: an :class:`~rs_interp.circuits.AttributionPatching` and a
    :class:`~rs_interp.heads.HeadAblationScan`, or two :class:`~rs_interp.circuits.EdgeEffects`), or ``labels``,
    ``exact`` and ``estimate``. Labels show on hover (a crowded plot stays legible).

    >>> import rs_interp as ri
    >>> m, a, b = ri.load_toy_model(), ri.induction_batch(4, seed=0), ri.induction_batch(4, seed=1)
    >>> metric = ri.next_token_loss(a.targets)
    >>> atp = ri.attribution_patching(m, a.tokens, metric, reference=b.tokens)
    >>> scan = ri.head_ablation_scan(m, a.tokens, metric, ablation="resample", reference=b.tokens)
    >>> len(estimate_vs_exact_figure(atp, scan).data[1].x)
    4
    """
    if estimate is None:
        est, ex = labels, exact
        if hasattr(est, "layout") and hasattr(ex, "layout"):  # edges
            keep = est.layout.exists
            labels = [f"{s} -> {r}" for s, r in est.layout.edges()]
            estimate, exact = est.effect[keep].tolist(), ex.effect[keep].tolist()
            what = "edges"
        else:
            labels, estimate, exact, what = (list(est.labels), est.effect.flatten().tolist(),
                                             ex.effect.flatten().tolist(), "heads")
        title = title or f"{type(est).__name__} against {type(ex).__name__} ({what})"
    pairs = [(x, y) for x, y in zip(exact, estimate) if not (math.isnan(x) or math.isnan(y))]
    lo, hi = min(v for p in pairs for v in p), max(v for p in pairs for v in p)
    fig = go.Figure([go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(dash="dot", color="grey"),
                                name="estimate = exact"),
                     go.Scatter(x=list(exact), y=list(estimate), mode="markers", text=list(labels), name="items",
                                hovertemplate="%{text}: exact %{x:.3f}, estimate %{y:.3f}<extra></extra>")])
    fig.update_layout(title=title or "Estimate against the exact effect", xaxis_title="exact effect",
                      yaxis_title="estimate", height=420)
    return fig


def faithfulness_figure(curves, *, title: str = "Faithfulness of the top edges") -> go.Figure:
    """Faithfulness against the fraction of edges kept (log axis), one line per curve: a
    :class:`~rs_interp.circuits.FaithfulnessCurve`, an :class:`~rs_interp.circuits.MIBScores` (both of its curves), or
    a mapping name -> either (e.g. ``{"EAP": ..., "exact": ...}``), each curve's area in its legend entry (CPR for a
    curve ranked by signed score, CMD for one ranked by absolute score: MIB's); 1 (the full model) dotted.

    >>> import rs_interp as ri
    >>> m, a, b = ri.load_toy_model(), ri.induction_batch(4, seed=0), ri.induction_batch(4, seed=1)
    >>> metric = ri.next_token_loss(a.targets)
    >>> eap = ri.edge_attribution_patching(m, a.tokens, metric, reference=b.tokens)
    >>> len(faithfulness_figure(ri.mib_scores(m, a.tokens, metric, eap, reference=b.tokens)).data)
    2
    """
    if hasattr(curves, "faithfulness"):
        curves = {"top edges": curves}
    elif hasattr(curves, "signed") and hasattr(curves, "absolute"):
        curves = {"by signed score": curves.signed, "by |score|": curves.absolute}
    if not curves:
        raise ValueError("curves is empty; pass at least one FaithfulnessCurve")
    items = []
    for name, c in curves.items():
        if hasattr(c, "signed") and hasattr(c, "absolute"):
            items += [(f"{name}, by signed score", c.signed), (f"{name}, by |score|", c.absolute)]
        else:
            items.append((name, c))
    fig = go.Figure()
    for name, c in items:
        area = f"CPR {c.cpr:.3f}" if c.ranking == "signed" else f"CMD {c.cmd:.3f}"
        fig.add_trace(go.Scatter(x=[100 * f for f in c.fractions], y=list(c.faithfulness), mode="lines+markers",
                                 name=f"{name} ({area})"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)]  # one label a tick: plotly's repeats 2, 5 a decade
    fig.update_layout(title=title, xaxis_title="edges kept (%)", yaxis_title="faithfulness", xaxis_type="log",
                      height=400)
    fig.update_xaxes(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    return fig


def ground_truth_figure(aurocs, *, title: str = "Each method's scores against the known circuit (AUROC)") -> go.Figure:
    """Grouped bars: per model (x), one bar per method, its AUROC against the known circuit (left) and against the
    known edges that carry effect under the patch (right); ``aurocs[model][method]`` is a
    :class:`~rs_interp.circuits.ground_truth.MethodScores` (what ``score_methods`` returns per model) or ``(vs known,
    vs effective)``, None where undefined (no bar). Chance (0.5) dotted."""
    aurocs = {model: {m: (v.auroc, v.auroc_effective) if hasattr(v, "auroc") else v for m, v in per.items()}
              for model, per in aurocs.items()}
    if not aurocs:
        raise ValueError("aurocs is empty; pass at least one model")
    models = list(aurocs)
    methods = list(dict.fromkeys(m for per in aurocs.values() for m in per))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True,
                        subplot_titles=("vs the known circuit", "vs its edges that carry effect"))
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf"]
    for j, method in enumerate(methods):
        for col in (0, 1):
            y = [aurocs[m].get(method, (None, None))[col] for m in models]
            fig.add_trace(go.Bar(x=models, y=y, name=method, legendgroup=method, showlegend=col == 0,
                                 marker_color=colours[j % len(colours)]), row=1, col=col + 1)
    for col in (1, 2):
        fig.add_hline(y=0.5, line_dash="dot", line_color="#888", row=1, col=col)
    fig.update_layout(title=title, barmode="group", height=450, yaxis_title="AUROC", yaxis_range=[0, 1.05])
    return fig
