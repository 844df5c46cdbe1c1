"""Interventions on a graph's nodes: scale a feature (or set its activation), an error node or a
token's embedding, run, and compare each target's change with what the graph predicts.

In the **frozen** run (attention patterns and norm scales at their values in the clean run, every
MLP's output at its clean value except for the transcoders' skip paths into it and the change made), each
target moves by exactly ``sum_s A[t, s] (factor_s - 1)``: the graph's direct effects, since the
frozen model is linear in the nodes' writes. In the **live** run (``frozen=False``) attention,
norms and MLPs respond, and the graph's direct effects are only a first-order prediction: the gap
measures the indirect effects and the nonlinearity. A changed feature's write is
``(new - current activation) W_dec`` added to its MLP's output, as circuit-tracer does. A feature with a
post-encoder bias ``c`` (:mod:`.transcoders`) writes ``(a + c) W_dec`` (per output, a cross-layer one's ``c``
per output): ``scale`` scales that write, its value ``a + c`` (the live run adds ``factor (a + c) - (a' + c s')``,
``a'`` and ``s'`` its activation and selection there); ``value`` is refused for it (its write would not move
along its graph column).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float

from .. import _names as N
from .._backend import Model
from .._format import Top
from ..exact.needs import GRAPH, TRANSCODERS, needs
from . import _replacement as R
from .graph import AttributionGraph
from .transcoders import TranscoderSet

__all__ = ["Intervention", "intervene"]


@dataclass(frozen=True)
class Intervention:
    """The targets' changes under an intervention, beside the graph's prediction.

    Attributes:
        labels: the targets: every feature node and logit node of the graph.
        before: (target,) their values in the clean run (pre-activations, demeaned logits).
        after: (target,) their values in the intervened run.
        predicted: (target,) the graph's direct effects times ``factor - 1``, summed over the changed nodes.
        frozen: whether the run was the frozen replacement model (where the prediction is exact).

    >>> import torch
    >>> iv = Intervention(("a",), torch.tensor([1.0]), torch.tensor([3.0]), torch.tensor([2.0]), True)
    >>> float(iv.actual[0]), iv.gap
    (2.0, 0.0)
    """

    labels: tuple[str, ...]
    before: Float[torch.Tensor, " target"]
    after: Float[torch.Tensor, " target"]
    predicted: Float[torch.Tensor, " target"]
    frozen: bool

    @property
    def actual(self) -> Float[torch.Tensor, " target"]:
        """``after - before``."""
        return self.after - self.before

    @property
    def gap(self) -> float:
        """The largest ``|actual - predicted|`` (rounding in the frozen run)."""
        return float((self.actual - self.predicted).abs().max()) if len(self.labels) else 0.0

    def top(self, k: int = 5) -> list[tuple[str, float, float]]:
        """The ``k`` targets that moved most: ``(label, actual change, predicted change)``."""
        idx = self.actual.abs().topk(min(k, len(self.labels))).indices
        return Top((self.labels[int(i)], float(self.actual[i]), float(self.predicted[i])) for i in idx)


def _factors(graph: AttributionGraph, transcoders: TranscoderSet, nodes: Sequence[int], scale,
             value) -> list[tuple[int, float]]:
    if (scale is None) == (value is None):
        raise ValueError("give exactly one of scale (any node) and value (feature nodes: the new activation)")
    kinds = graph.kinds()
    out = []
    for n in nodes:
        n = int(n)
        if not 0 <= n < graph.n_nodes or kinds[n] == "logit":
            raise ValueError(f"node {n} is not a feature, error or token node of this graph "
                             f"(0..{graph.n_nodes - graph.n_logits - 1})")
        if kinds[n] == "error" and (n - graph.n_features) % graph.n_pos in graph.zero_positions:
            raise ValueError(f"node {n} is an error node at a zeroed position (zero_positions={graph.zero_positions}): "
                             "no node carries what that MLP output holds (it is part of the bias), "
                             "so it has nothing to scale")
        if value is not None:
            if kinds[n] != "feature":
                raise ValueError(f"value sets a feature's activation; node {n} is a {kinds[n]} node (use scale)")
            if transcoders[int(graph.features[n, 0])].post_bias is not None:
                raise ValueError(f"node {n}'s transcoder adds a post-encoder bias c to its activation a: a new "
                                 "activation moves its write (a + c) W_dec off its graph column; use scale (it scales "
                                 "a + c)")
            out.append((n, float(value) / float(graph.activations[n])))
        else:
            out.append((n, float(scale)))
    return out


@needs(*GRAPH, name="features.intervene", optional=TRANSCODERS, refuses=("attention-only", "soft-capped logits"))
def intervene(model: Model, transcoders: TranscoderSet, graph: AttributionGraph, nodes: Sequence[int], *,
              scale: float | None = None, value: float | None = None, frozen: bool = True) -> Intervention:
    """Scale the writes of graph nodes ``nodes`` (a feature's activation, an error vector, a token's
    embedding) by ``scale``, or set feature nodes' activation to ``value``; run; and compare the
    targets' changes with the graph's prediction (module docstring).

    Raises:
        ValueError: a node that is not a feature, error or token node, or an error node at one of the graph's
            ``zero_positions``; both or neither of scale and value; ``value`` for a feature whose transcoder has a
            post-encoder bias (module docstring).

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, shipped_transcoders
    >>> model, tcs = load_toy_model("code-2l"), shipped_transcoders("code-2l")
    >>> g = attribution_graph(model, tcs, torch.arange(200, 208), targets=[208])
    >>> iv = intervene(model, tcs, g, [0], scale=2.0)
    >>> iv.gap < 1e-3, iv.frozen
    (True, True)
    """
    R.check_replacement(model, transcoders, "features.intervene")
    model = R.working_copy(model)
    changes = _factors(graph, transcoders, nodes, scale, value)
    dt = model.cfg.dtype
    tcs = R.working_set(transcoders, dt)
    tokens = graph.tokens[None]
    kinds = graph.kinds()
    n_err0 = graph.n_features
    L, P = graph.n_layers, graph.n_pos
    with R.quiet_model(model), torch.no_grad():
        clean = R.clean_run(model, tcs, tokens)
        embed = clean.embed.clone()
        writes = torch.zeros(L, P, model.cfg.d_model, dtype=dt)  # what the changes add to each MLP output
        feature_sets: list[tuple[int, int, int, float]] = []
        for n, factor in changes:
            if kinds[n] == "feature":
                l, p, f = graph.features[n].tolist()
                feature_sets.append((l, p, f, factor))
            elif kinds[n] == "error":
                l, p = divmod(n - n_err0, P)
                writes[l, p] += (factor - 1.0) * graph.errors[l, p].to(dt)
            else:
                p = n - n_err0 - L * P
                embed[p] = embed[p] * factor
        if frozen:
            for l, p, f, factor in feature_sets:
                a = float(graph.activations[graph.feature_node(l, p, f)])
                # its own MLP's output (and, cross-layer, every later one): its write (a, or a + c) scaled
                for (out, W), c in zip(tcs.writes_from(l), tcs.post_biases_from(l)):
                    writes[out, p] += (factor - 1.0) * (a if c is None else a + float(c[f])) * W[f]
            inputs, logits = R.frozen_forward(model, tcs, clean, tokens, embed=embed,
                                              outputs=lambda l, xs: clean.outputs[l] + tcs.skip_into(l, xs)
                                              - tcs.skip_into(l, clean.inputs) + writes[l])
        else:
            inputs, logits = _live_run(model, tcs, tokens, embed, writes, feature_sets, graph)
        after = _targets(graph, tcs, inputs, logits)
        before = _targets(graph, tcs, list(clean.inputs), clean.logits)
    predicted = torch.zeros(len(before), dtype=graph.adjacency.dtype)
    rows = torch.cat([torch.arange(graph.n_features), torch.arange(graph.n_nodes - graph.n_logits, graph.n_nodes)])
    for n, factor in changes:
        predicted += graph.adjacency[rows, n] * (factor - 1.0)
    labels = graph.labels()
    return Intervention(tuple(labels[int(r)] for r in rows), before, after, predicted, frozen)


def _targets(graph: AttributionGraph, tcs: TranscoderSet, inputs, logits) -> torch.Tensor:
    """Every feature node's pre-activation and every logit node's demeaned logit."""
    pre = [inputs[l][p] @ tcs[l].W_enc[f] + tcs[l].b_enc[f] for l, p, f in graph.features.tolist()]
    last = logits[graph.position]
    out = (last - (last.mean() if graph.centered else 0.0))[graph.logit_tokens]
    return torch.cat([torch.stack(pre).to(out.dtype), out]) if pre else out


def _live_run(model, tcs, tokens, embed, writes, feature_sets, graph):
    """The model's own forward, nothing frozen: each changed feature's write is its new activation
    minus its current one (on this run's input), times its decoder row, added to its MLP's output (with a
    post-encoder bias ``c``: ``factor (a + c) - (a' + c s')``, module docstring)."""
    box: dict[str, torch.Tensor] = {}
    by_layer: dict[int, list[tuple[int, int, float, float]]] = {}
    for l, p, f, factor in feature_sets:
        a = float(graph.activations[graph.feature_node(l, p, f)])
        by_layer.setdefault(l, []).append((p, f, factor * a, factor))

    def read(l: int):
        return lambda t, hook: box.__setitem__(l, R.finish_input(model, tcs, l, t)[0])

    changed: dict[tuple[int, int, int], torch.Tensor] = {}  # each changed feature's new minus current activation
    chosen: dict[tuple[int, int, int], torch.Tensor] = {}  # with a post-encoder bias: whether this run selects it

    def change(src: int, p: int, f: int, factor: float, c: torch.Tensor | None) -> torch.Tensor:
        if c is None:
            return changed[(src, p, f)]
        return changed[(src, p, f)] + (factor - chosen[(src, p, f)]) * c[f]

    def out(l: int):
        def hook(t: torch.Tensor, hook) -> torch.Tensor:
            extra = writes[l].clone()
            for p, f, new, _ in by_layer.get(l, []):
                changed[(l, p, f)] = new - tcs[l].encode(box[l][p])[f]
                if tcs[l].post_bias is not None:
                    chosen[(l, p, f)] = tcs[l].selected(box[l][p])[f].to(changed[(l, p, f)].dtype)
            for src in by_layer:
                for (target, W), c in zip(tcs.writes_from(src), tcs.post_biases_from(src)):
                    if target == l:  # the changes of layer src's features reach this MLP output
                        for p, f, _, factor in by_layer[src]:
                            extra[p] += change(src, p, f, factor, c) * W[f]
            return t + extra[None].to(t.dtype)
        return hook

    hooks = [(N.EMBED, lambda t, hook: embed[None].to(t.dtype))]
    for l in range(model.cfg.n_layers):
        hooks += [(R.input_hook(model, tcs, l), read(l)), (N.mlp_out(l), out(l))]
    with model.hooks(fwd_hooks=hooks):
        logits = model(tokens, return_type="logits")
    return [box[l] for l in range(model.cfg.n_layers)], logits[0]
