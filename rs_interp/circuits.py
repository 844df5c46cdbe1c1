"""Circuits (sets of edges of the model's graph) and how faithful they are.

A circuit keeps its edges and ablates every other one: receiver ``r``'s input becomes

    input_r + sum over senders s upstream of r with (s, r) outside the circuit of (ablated_s - write_s)

where ``write_s`` is the sender's write in this very run (upstream ablations propagate) and
``ablated_s`` its write in the reference run (``"resample"``, pair by pair) or its mean over the
reference batch at each position (``"mean"``). One forward pass per circuit, exact: the circuit of
every edge is the clean run, the empty circuit the reference run (resample; tested to 1e-9).

Faithfulness (the MIB benchmark's circuit track, Mueller et al. 2025) of a circuit ``C`` is
``(m(C) - m(empty)) / (m(full) - m(empty))``; :func:`faithfulness_curve` evaluates the top edges of an
edge score at several sizes, and the curve's areas: CPR (the area under it) and CMD (the area
between it and 1), each by the trapezoid rule over the fraction of edges kept.

>>> from rs_interp import load_toy_model, induction_batch, next_token_loss, edge_attribution_patching
>>> model = load_toy_model("induction-2l")
>>> a, b = induction_batch(8, seed=0), induction_batch(8, seed=1)
>>> metric = next_token_loss(a.targets)
>>> curve = faithfulness_curve(model, edge_attribution_patching(model, a.tokens, metric, reference=b.tokens),
...                            a.tokens, metric, reference=b.tokens)
>>> len(curve.fractions), round(curve.faithfulness[-1], 6)
(10, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

from ._backend import Model, kv_groups, per_head_inputs
from ._state import preserve_state
from ._validate import check_tokens
from .attribution_patching import RESID0, _prepare, _record
from .edge_attribution import _sender_points
from .edges import EdgeEffects, EdgeLayout, edge_layout
from .metrics import Metric, metric_value

__all__ = ["MIB_FRACTIONS", "FaithfulnessCurve", "evaluate_circuit", "faithfulness_curve", "top_edges"]

#: The circuit sizes of the MIB circuit track: fractions of the model's edges kept.
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

Ablation = Literal["resample", "mean"]


def top_edges(scores: EdgeEffects, n: int) -> frozenset[tuple[str, str]]:
    """The ``n`` edges with the largest ``|effect|`` (ties: the earlier edge, row-major).

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)
        >>> best = top_edges(eap, 3)
        >>> len(best), best <= set(eap.layout.edges())
        (3, True)
    """
    edges = scores.layout.edges()
    values = scores.effect[scores.layout.exists].abs().nan_to_num(-1.0)
    order = sorted(range(len(edges)), key=lambda i: (-float(values[i]), i))
    return frozenset(edges[i] for i in order[:n])


def _mask(layout: EdgeLayout, circuit: Iterable[tuple[str, str]]) -> torch.Tensor:
    mask = torch.zeros_like(layout.exists)
    for edge in circuit:
        mask[layout.index(tuple(edge))] = True
    return mask


def _ablated_writes(model: Model, reference: torch.Tensor, method: str, batch: int) -> dict[str, torch.Tensor]:
    """Per sender point, what an ablated sender writes: the reference run's value (resample) or its
    mean over the reference batch per position (mean), with the run's batch size."""
    ref = _record(model, reference, _sender_points(model))
    if method == "mean":
        ref = {k: v.mean(0, keepdim=True).expand(batch, *v.shape[1:]) for k, v in ref.items()}
    return ref


def _run_circuit(model: Model, tokens: torch.Tensor, metric: Metric, layout: EdgeLayout, keep: torch.Tensor,
                 ablated: dict[str, torch.Tensor]) -> float:
    """The metric with every edge outside ``keep`` (sender, receiver) ablated, in one forward pass."""
    cfg = model.cfg
    L, H, G = cfg.n_layers, cfg.n_heads, kv_groups(cfg)
    cut = (layout.exists & ~keep).to(torch.float64)  # (sender, receiver): edges to ablate
    column = {r: j for j, r in enumerate(layout.receivers)}
    diffs: list[torch.Tensor] = []  # per sender, in layout order: ablated - this run's write (batch, pos, d_model)

    def sender(kind: str, layer: int):
        def fn(t: torch.Tensor, *, hook) -> None:
            name = RESID0 if kind == "embed" else f"blocks.{layer}.attn.hook_z" if kind == "z" else f"blocks.{layer}.hook_mlp_out"
            d = (ablated[name] - t).to(torch.float64)
            if kind == "z":
                W_O = model.blocks[layer].attn.W_O.to(torch.float64)
                diffs.extend(torch.einsum("bphd,hdm->hbpm", d, W_O))
            else:
                diffs.append(d)
        return fn

    def receiver(labels: list[str]):
        cols = [column[r] for r in labels]

        def fn(t: torch.Tensor, *, hook) -> torch.Tensor:
            D = torch.stack(diffs)  # every sender so far: exactly the upstream ones
            w = cut[: len(diffs), cols]  # (upstream sender, receiver)
            if t.ndim == 4:  # per-head inputs
                return t + torch.einsum("sbpm,sn->bpnm", D, w).to(t.dtype)
            return t + torch.einsum("sbpm,s->bpm", D, w[:, 0]).to(t.dtype)

        return fn

    # Hooks in the order the forward pass meets them, senders recorded before their readers.
    fwd = [(RESID0, sender("embed", 0))]
    for l in range(L):
        for x in "qkv":
            labels = [f"L{l}KV{g}.{x}" for g in range(G)] if G != H and x != "q" else [f"L{l}H{h}.{x}" for h in range(H)]
            fwd.append((f"blocks.{l}.hook_{x}_input", receiver(labels)))
        fwd.append((f"blocks.{l}.attn.hook_z", sender("z", l)))
        if not cfg.attn_only:
            fwd.append((f"blocks.{l}.hook_mlp_in", receiver([f"MLP{l}"])))
            fwd.append((f"blocks.{l}.hook_mlp_out", sender("mlp", l)))
    fwd.append((f"blocks.{L - 1}.hook_resid_post", receiver(["logits"])))
    with per_head_inputs(model, fwd) as runnable, model.hooks(fwd_hooks=runnable):
        return metric_value(metric(model(tokens, return_type="logits")), "circuit run")


def evaluate_circuit(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    circuit: Iterable[tuple[str, str]],
    *,
    reference: Int[torch.Tensor, "batch pos"],
    method: Ablation = "resample",
) -> float:
    """``metric`` of the run with every edge outside ``circuit`` ablated (module docstring).

    Args:
        circuit: ``(sender, receiver)`` edges to keep, labelled as :func:`rs_interp.edge_layout` does.
        reference: tokens of the reference run (the shape of ``tokens`` for ``"resample"``; as long
            as ``tokens`` for ``"mean"``).
        method: ``"resample"`` (an ablated edge carries the reference run's write, pair by pair) or
            ``"mean"`` (the mean over the reference batch, per position).

    Raises:
        ValueError: an unknown label or a pair that is not an edge, bad tokens or method.

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> every = rs_interp.edge_layout(model).edges()
        >>> abs(evaluate_circuit(model, a, metric, every, reference=b) - float(metric(model(a)).detach())) < 1e-5
        True
        >>> abs(evaluate_circuit(model, a, metric, [], reference=b) - float(metric(model(b)).detach())) < 1e-5
        True
    """
    tokens, reference = _check(model, tokens, reference, method)
    layout = edge_layout(model)
    keep = _mask(layout, circuit)
    flags = {} if model.cfg.attn_only else dict(use_hook_mlp_in=True)
    with preserve_state(model, **flags), torch.no_grad():
        return _run_circuit(model, tokens, metric, layout, keep, _ablated_writes(model, reference, method, tokens.shape[0]))


def _check(model: Model, tokens: torch.Tensor, reference: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    if method not in ("resample", "mean"):
        raise ValueError(f"method must be 'resample' or 'mean', got {method!r}")
    if method == "resample":
        return _prepare(model, tokens, reference)
    tokens, reference = check_tokens(model, tokens), check_tokens(model, reference, "reference")
    if reference.shape[1] != tokens.shape[1]:
        raise ValueError(f"reference must be as long as tokens ({tokens.shape[1]} positions) for mean ablation, got {reference.shape[1]}")
    return tokens, reference


@dataclass(frozen=True)
class FaithfulnessCurve:
    """Faithfulness of the top edges of a score at several circuit sizes.

    Attributes:
        fractions: the fractions of the model's edges kept.
        n_edges: the number of edges kept at each size (``ceil(fraction * total)``).
        values: the metric of each circuit.
        faithfulness: ``(values - empty) / (full - empty)``.
        full, empty: the metric with every edge kept (the clean run) and with none.
        cpr: the area under the faithfulness curve (trapezoid rule over ``fractions``).
        cmd: the area between the curve and 1, ``|1 - faithfulness|`` (same rule).

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)
        >>> curve = rs_interp.faithfulness_curve(model, eap, a, metric, reference=b, fractions=(0.1, 0.5, 1.0))
        >>> len(curve.values) == len(curve.faithfulness) == len(curve.fractions) == 3
        True
    """

    fractions: tuple[float, ...]
    n_edges: tuple[int, ...]
    values: tuple[float, ...]
    faithfulness: tuple[float, ...]
    full: float
    empty: float
    cpr: float
    cmd: float


def _area(x: Sequence[float], y: Sequence[float]) -> float:
    return float(sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1)))


def faithfulness_curve(
    model: Model,
    scores: EdgeEffects,
    tokens: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    *,
    reference: Int[torch.Tensor, "batch pos"],
    fractions: Sequence[float] = MIB_FRACTIONS,
    method: Ablation = "resample",
    progress: bool = False,
) -> FaithfulnessCurve:
    """The faithfulness of the top ``ceil(f * n_edges)`` edges of ``scores`` (by ``|effect|``) for
    each ``f`` in ``fractions`` (MIB's ten sizes by default), over the pairs ``tokens`` /
    ``reference`` (row by row), with CPR and CMD (module docstring).

    Raises:
        ValueError: ``scores`` from another model's layout, fractions not increasing in (0, 1], the
            full and empty circuits giving the same metric (faithfulness undefined).

    Example:
        >>> import rs_interp
        >>> from rs_interp import load_toy_model, induction_batch
        >>> model = load_toy_model("induction-2l")
        >>> a, b = induction_batch(4, seed=0).tokens, induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b)
        >>> curve = faithfulness_curve(model, eap, a, metric, reference=b, fractions=(0.5, 1.0))
        >>> curve.n_edges, round(curve.faithfulness[-1], 6)
        ((15, 29), 1.0)
    """
    tokens, reference = _check(model, tokens, reference, method)
    layout = edge_layout(model)
    if scores.layout.senders != layout.senders or scores.layout.receivers != layout.receivers:
        raise ValueError("scores belong to another model's edge layout")
    fr = [float(f) for f in fractions]
    if not fr or any(not 0 < f <= 1 for f in fr) or any(b <= a for a, b in zip(fr, fr[1:])):
        raise ValueError(f"fractions must increase within (0, 1], got {tuple(fractions)}")
    total = layout.n_edges
    sizes = [min(total, math.ceil(f * total)) for f in fr]
    flags = {} if model.cfg.attn_only else dict(use_hook_mlp_in=True)
    with preserve_state(model, **flags), torch.no_grad():
        ablated = _ablated_writes(model, reference, method, tokens.shape[0])
        run = lambda keep: _run_circuit(model, tokens, metric, layout, keep, ablated)  # noqa: E731
        full = metric_value(metric(model(tokens, return_type="logits")), "clean run")
        empty = run(torch.zeros_like(layout.exists))
        if full == empty:
            raise ValueError(f"the full and the empty circuit give the same metric ({full}): faithfulness is undefined")
        values = [run(_mask(layout, top_edges(scores, n))) for n in tqdm(sizes, desc="faithfulness", disable=not progress, leave=False)]
    faith = [(v - empty) / (full - empty) for v in values]
    return FaithfulnessCurve(fractions=tuple(fr), n_edges=tuple(sizes), values=tuple(values), faithfulness=tuple(faith),
                             full=full, empty=empty, cpr=_area(fr, faith), cmd=_area(fr, [abs(1 - f) for f in faith]))
