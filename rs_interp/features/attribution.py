"""Attribution graphs over transcoder features (Ameisen et al. 2025; circuit-tracer's algorithm),
exact in the local replacement model, on TransformerLens 3 and 4.

In the local replacement model of one prompt (attention patterns and norm scales frozen at their
values in the run, each MLP's output cut from its input except through the transcoders' linear
skips into it), every transcoder input and the final stream are linear in what is written into the stream:
the token embeddings, each active feature's write ``a_s W_dec[s]`` (with a post-encoder bias ``c``,
``(a_s + c_s) W_dec[s]``: :mod:`.transcoders`) and each error vector (the MLP output minus its
reconstruction), plus a constant. So a target's value

    t = sum_s A[t, s] + bias_t,       A[t, s] = write_s . J_{t <- s}^T v_t

where ``v_t`` is the vector the target reads with (a feature's encoder row ``W_enc[f]``, read at its
layer's transcoder input; a logit's demeaned unembedding column ``W_U[:, k] - mean_j W_U[:, j]``, read
at the final normalized stream), and ``J^T v_t`` the gradient of ``v_t . (read point)`` at the
source's write point. One backward pass per batch of targets gives a whole row per target
(``is_grads_batched``: the forward is run once, for one row, whatever the batch).

What is checked as it is built: every feature and logit row plus its bias sums to the target's own
value in the run (the bias is measured by running the frozen model with every node switched off),
or ``ValueError``. Interventions in the frozen model move targets by exactly the graph's entries
(:mod:`rs_interp.features.interventions`; the tests check it in float64 to 1e-9).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Int

from .._backend import Model
from .._progress import DELAY
from .._state import outside_inference_mode
from ..exact.needs import GRAPH, TRANSCODERS, needs
from . import _conventions as C
from . import _direct as D
from . import _replacement as R
from . import _rows
from .graph import AttributionGraph
from .transcoders import TranscoderSet

__all__ = ["attribution_graph"]

#: Slack of the row-sum check in units of machine epsilon times the size of the terms (the sum of
#: their magnitudes); measured gaps stay within a few units.
_EPS_FACTOR = 64


def _tokens(model: Model, tokens) -> torch.Tensor:
    t = torch.as_tensor(tokens)
    if t.ndim == 2 and t.shape[0] == 1:
        t = t[0]
    if t.ndim != 1 or t.dtype.is_floating_point or t.dtype == torch.bool or len(t) == 0:
        raise ValueError(f"tokens must be one prompt of token ids, (pos,) or (1, pos); "
                         f"got shape {tuple(t.shape)}, {t.dtype}")
    if len(t) > model.cfg.n_ctx:
        raise ValueError(f"tokens: {len(t)} positions, the model's context is {model.cfg.n_ctx}")
    if int(t.min()) < 0 or int(t.max()) >= model.cfg.d_vocab:
        raise ValueError(f"tokens must be in [0, {model.cfg.d_vocab}), got [{int(t.min())}, {int(t.max())}]")
    return t.long()


def _logit_targets(probs: torch.Tensor, targets, max_logits: int, logit_probability: float) -> torch.Tensor:
    if targets is None:  # the most probable tokens, until their probability reaches logit_probability
        ranked, order = probs.sort(descending=True)
        n = int((ranked.cumsum(0) < logit_probability).sum()) + 1
        return order[: max(1, min(n, max_logits))]
    t = torch.as_tensor(targets).long().flatten()
    if len(t) == 0 or int(t.min()) < 0 or int(t.max()) >= len(probs) or len(set(t.tolist())) != len(t):
        raise ValueError(f"targets must be distinct token ids in [0, {len(probs)}), got {t.tolist()}")
    return t


@dataclass(frozen=True)
class GraphOptions:
    """:func:`attribution_graph`'s options as one value, checked when made (the arguments of the same names).

    ``position`` is as given (it is checked against the prompt when the graph is made); ``convention``,
    ``zero_positions``, ``prepend_bos``, ``feature_order`` and ``round_size`` are resolved against the model
    and the prompt then (:func:`._conventions.resolve`).

    Raises:
        ValueError: ``batch_size`` below 1 or ``max_feature_nodes`` below 0.

    >>> GraphOptions(batch_size=16).max_logits
    10
    """

    targets: Sequence[int] | torch.Tensor | None = None
    position: int = -1
    max_logits: int = 10
    logit_probability: float = 0.95
    centered: bool = True
    max_feature_nodes: int | None = None
    batch_size: int = 64
    progress: bool = True
    dense: bool = True
    convention: C.GraphConvention = "rs_interp"
    zero_positions: slice | int | Sequence[int] | None = None
    prepend_bos: bool | int | None = None
    feature_order: C.FeatureOrder | None = None
    round_size: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1 or (self.max_feature_nodes is not None and self.max_feature_nodes < 0):
            raise ValueError("batch_size must be >= 1 and max_feature_nodes >= 0")


@needs(*GRAPH, "gradients", name="features.attribution_graph", optional=TRANSCODERS,
       refuses=("attention-only", "soft-capped logits"))
@outside_inference_mode
def attribution_graph(
    model: Model,
    transcoders: TranscoderSet,
    tokens: Int[torch.Tensor, " pos"],
    *,
    targets: Sequence[int] | Int[torch.Tensor, " logit"] | None = None,
    position: int = -1,
    max_logits: int = 10,
    logit_probability: float = 0.95,
    centered: bool = True,
    max_feature_nodes: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
    dense: bool = True,
    convention: C.GraphConvention = "rs_interp",
    zero_positions: slice | int | Sequence[int] | None = None,
    prepend_bos: bool | int | None = None,
    feature_order: C.FeatureOrder | None = None,
    round_size: int | None = None,
) -> AttributionGraph:
    """The attribution graph of one prompt: feature, error, token and logit nodes and the exact direct
    effects between them in the local replacement model (module docstring for the formula).

    Args:
        transcoders: one per layer (:func:`rs_interp.features.load_transcoders`,
            :func:`~rs_interp.features.train_transcoder`, :func:`~rs_interp.features.mlp_transcoders`); cast to the
            model's dtype.
        tokens: the prompt, (pos,) or (1, pos).
        targets: the logit nodes' tokens, read at ``position``; default the most probable tokens
            until their probability reaches ``logit_probability`` (at most ``max_logits``).
        centered: a logit node's value is its logit minus the mean logit (circuit-tracer's; the
            read vector ``W_U[:, k] - mean_j W_U[:, j]``); ``False``: the raw logit (read with
            ``W_U[:, k]``, ``b_U`` in the bias), e.g. for a model with one output.
        max_feature_nodes: keep at most this many feature nodes, chosen as circuit-tracer does, by
            their influence on the rows computed so far; the rest's direct effects are summed in
            ``unselected`` (so every row still sums to its value). Default: every active feature.
        batch_size: targets per backward pass.
        progress: a progress bar over the feature rows, and the estimate of time and peak memory
            (:func:`rs_interp.features.estimate_graph`) written above it before a run estimated to take
            2 s or more (TopK transcoders).
        dense: the adjacency as a (node, node) tensor; ``False``: only its rows that can be nonzero
            (:class:`~rs_interp.features._rows.RowMatrix`, read the same way), for long prompts. The
            entries, influence, pruning and scores are the same either way.
        convention: whose defaults the four options below take when left at ``None``: ``"rs_interp"``
            (every position kept, the ids as given, features in the order chosen, rs_interp's rounds) or
            ``"circuit-tracer"`` (position 0 zeroed, four positions for a Gemma-3 ``-it`` model; BOS prepended;
            features in their active order; rounds of 2,048): the graph circuit-tracer's ``attribute`` computes.
        zero_positions: positions of the attributed prompt (BOS included) whose features and error vectors are
            no nodes (circuit-tracer's ``zero_positions``, a slice there): what their MLP outputs hold is a
            constant of the replacement model, part of each row's ``bias``; their token nodes stay.
        prepend_bos: ``True``: prepend the model tokenizer's BOS (the first of its BOS, pad, EOS, special ids)
            unless the first id is a special one (circuit-tracer's ``ensure_tokenized``); an id: prepend that
            one unless the prompt starts with it; ``False``: the ids as given. ``position`` counts in the ids
            as given; the graph's tokens and positions include the BOS.
        feature_order: the feature nodes under ``max_feature_nodes``: ``"selection"`` in the order chosen,
            ``"index"`` in their active order (layer, position, index: circuit-tracer's ``torch.where(visited)``).
        round_size: features chosen from one influence estimate (circuit-tracer's ``update_interval *
            batch_size``); default rs_interp's: ``max(4 * batch_size, max_feature_nodes / 8)``.

    Raises:
        ValueError: bad tokens, targets or position; a model whose replacement is not linear once
            frozen (attention-only, soft-capped logits, parallel blocks, an unknown norm); transcoders
            that do not fit the model; or a row that does not sum to its target's value (a hook the
            caller attached changed the run); an unknown convention or feature order, zero positions outside
            the prompt, a BOS that cannot be found or is out of the vocabulary, a Gemma-3 ``-it`` prompt without
            its ``<bos><start_of_turn>user\\n`` prefix.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import shipped_transcoders
    >>> model = load_toy_model("code-2l")
    >>> g = attribution_graph(model, shipped_transcoders("code-2l"), torch.arange(100, 108), targets=[108])
    >>> g.n_pos, g.n_logits, g.adjacency.shape[0] == g.n_features + 2 * 8 + 8 + 1
    (8, 1, True)
    >>> ct = attribution_graph(model, shipped_transcoders("code-2l"), torch.arange(100, 108), targets=[108],
    ...                        convention="circuit-tracer", prepend_bos=0)  # code-2l has no tokenizer: its BOS id given
    >>> ct.tokens[:2].tolist(), ct.zero_positions, int((ct.features[:, 1] == 0).sum())
    ([0, 100], (0,), 0)
    """
    return _Attribution(model, transcoders, tokens, GraphOptions(
        targets=targets, position=position, max_logits=max_logits, logit_probability=logit_probability,
        centered=centered, max_feature_nodes=max_feature_nodes, batch_size=batch_size, progress=progress, dense=dense,
        convention=convention, zero_positions=zero_positions, prepend_bos=prepend_bos, feature_order=feature_order,
        round_size=round_size)).graph()


@dataclass(frozen=True)
class _Nodes:
    """What the clean run gives (phase 1): the run itself, the next-token probabilities at the target position,
    the logit nodes' tokens, every active feature (layer, pos, index) with its activation, the error vectors."""

    clean: R.Clean
    probs: torch.Tensor
    logit_tokens: torch.Tensor
    features: torch.Tensor
    activations: torch.Tensor
    errors: torch.Tensor


@dataclass(frozen=True)
class _Computed:
    """What the backward passes give (phase 2): the logit rows, the selected features' rows (in the order
    computed), the selected features in the nodes' order, and in the order computed."""

    logit_rows: torch.Tensor
    feature_rows: _rows.FeatureRows
    selected: torch.Tensor
    computed: torch.Tensor


class _Attribution:
    """One attribution graph in the making (circuit-tracer's ``AttributionContext``): the working model and
    transcoders, the prompt with its conventions resolved, the options; it owns the replacement model's state
    (``quiet_model`` in :meth:`graph`: eval mode, no parameter gradients, every flag restored) and runs the phases
    in turn:
    the cost announced, the clean run, the rows, the constants, the graph assembled and checked."""

    def __init__(self, model: Model, transcoders: TranscoderSet, tokens, options: GraphOptions) -> None:
        o, given = options, _tokens(model, tokens)
        self.options, self.n_given = o, len(given)
        self.resolved = C.resolve(model, given, o.convention, o.zero_positions, o.prepend_bos, o.feature_order,
                                  o.round_size)
        self.tokens = _tokens(model, self.resolved.tokens)
        R.check_replacement(model, transcoders, "features.attribution_graph")
        self.model = R.working_copy(model)
        self.P, self.L = len(self.tokens), self.model.cfg.n_layers
        if not -len(given) <= int(o.position) < len(given):
            raise ValueError(f"position must be in [{-len(given)}, {len(given) - 1}], got {o.position}")
        self.position = int(o.position) % len(given) + self.P - len(given)
        self.tcs = R.working_set(transcoders, self.model.cfg.dtype)

    def graph(self) -> AttributionGraph:
        """Every phase in turn."""
        self.announce_cost()
        with R.quiet_model(self.model):
            nodes = self.clean_nodes()
            computed = self.rows(nodes)
            values, bias = self.constants(nodes, nodes.features[computed.selected], nodes.logit_tokens)
        return _assemble(self, nodes, computed, values, bias)

    def announce_cost(self) -> None:
        """The estimate of time and peak memory, written above the progress bar before a long run (TopK
        transcoders: the active features are known from the shapes)."""
        o = self.options
        if not o.progress or self.tcs[0].k is None:
            return
        from tqdm.std import tqdm  # write() only: no widget import (rs_interp._progress)

        from .estimate import estimate_graph, matmul_rate

        rate = matmul_rate(512, 2)  # ~10 ms: a rate for the line written above the bar, not a benchmark's
        cost = estimate_graph(self.model, self.tcs, self.P, max_feature_nodes=o.max_feature_nodes,
                              max_logits=o.max_logits, batch_size=o.batch_size, dense=o.dense, rate=rate)
        if cost.seconds >= DELAY:  # long work only, as the bars: a short call stays quiet
            tqdm.write(str(cost), file=sys.stderr)  # where the bars go: a script's stdout stays its own

    def clean_nodes(self) -> _Nodes:
        """Phase 1: the clean run, the logit targets and the active features and error vectors."""
        clean = R.clean_run(self.model, self.tcs, self.tokens[None])
        probs = clean.logits[self.position].double().softmax(-1)
        logit_tokens = _logit_targets(probs, self.options.targets, self.options.max_logits,
                                      self.options.logit_probability)
        features, activations, errors = D.active_nodes(self.tcs, clean, self.resolved.zero)
        return _Nodes(clean, probs, logit_tokens, features, activations, errors)

    def rows(self, nodes: _Nodes) -> _Computed:
        """Phase 2: the logit rows, then the feature rows (every active feature's, or the most influential's),
        from batched backward passes through one run of the replacement model."""
        o, dt = self.options, self.model.cfg.dtype
        W_U = self.model.W_U.detach().to(dt)
        centre = W_U.mean(1, keepdim=True) if o.centered else 0.0
        logit_reads = (W_U[:, nodes.logit_tokens] - centre).T  # (logit, d_model)
        with torch.enable_grad():
            run = R.grad_forward(self.model, self.tcs, self.tokens[None], patterns=nodes.clean.frozen)
            rows = D.Rows(run, nodes.features, nodes.activations, self.tcs, nodes.errors, nodes.clean.embed,
                          self.P, self.L)
            logit_rows = rows.compute([(self.L, self.position, v) for v in logit_reads], o.batch_size)
            feature_rows, selected = D.feature_rows(rows, nodes.features, logit_rows, nodes.probs[nodes.logit_tokens],
                                                    o.max_feature_nodes, o.batch_size, o.progress,
                                                    self.resolved.round_size)
        del run, rows
        computed = selected  # the rows' order; the nodes': as computed, or (circuit-tracer's) the active order
        if self.resolved.feature_order == "index":
            selected = selected.sort().values
        return _Computed(logit_rows, feature_rows, selected, computed)

    def constants(self, nodes: _Nodes, feats: torch.Tensor, logit_tokens: torch.Tensor):
        """Phase 3: each target's value in the run and its constant part, from the frozen model with every node off
        (no token embedding; each MLP writes only its transcoder's ``b_dec`` and skip, and at the zeroed positions
        what no node there carries: :func:`._conventions.frozen_outputs`)."""
        tcs, clean, zero = self.tcs, nodes.clean, torch.zeros_like(nodes.clean.embed)
        inputs, logits = R.frozen_forward(self.model, tcs, clean, self.tokens[None], embed=zero,
                                          outputs=C.frozen_outputs(tcs, clean, self.resolved.zero))

        def read(ins, lg):
            pre = [(ins[int(l)][int(p)] @ tcs[int(l)].W_enc[int(f)] + tcs[int(l)].b_enc[int(f)])
                   for l, p, f in feats.tolist()]
            last = lg[self.position] - (lg[self.position].mean() if self.options.centered else 0.0)
            return torch.cat([torch.stack(pre).to(lg.dtype) if pre else torch.zeros(0, dtype=lg.dtype),
                              last[logit_tokens]])

        with torch.no_grad():
            return read(list(clean.inputs), clean.logits), read(inputs, logits)


def _assemble(ctx: _Attribution, nodes: _Nodes, computed: _Computed, values: torch.Tensor,
              bias: torch.Tensor) -> AttributionGraph:
    """Phase 4: the graph from the rows (the selected features', then the logits'), checked row by row."""
    selected, logit_rows, L, P = computed.selected, computed.logit_rows, ctx.L, ctx.P
    n_sel, n_logit, n_active = len(selected), len(nodes.logit_tokens), len(nodes.features)
    n_nodes = n_sel + (L + 1) * P + n_logit
    dropped = torch.ones(n_active, dtype=logit_rows.dtype)
    dropped[selected] = 0.0
    kept, unselected_features = computed.feature_rows.columns(selected, dropped)  # (rows as computed, kept sources)
    if not torch.equal(computed.computed, selected):  # the rows in the nodes' order
        where = torch.empty(n_active, dtype=torch.long)
        where[computed.computed] = torch.arange(len(computed.computed))
        kept, unselected_features = kept[where[selected]], unselected_features[where[selected]]
    keep = torch.cat([selected, torch.arange(n_active, n_active + (L + 1) * P)])  # the logit rows' columns kept
    unselected_rows = torch.cat([unselected_features, logit_rows[:, :n_active] @ dropped])
    block = torch.cat([kept, logit_rows[:, keep]])  # every row that can be nonzero: the features', then the logits'
    del kept
    target_rows = torch.cat([torch.arange(n_sel), torch.arange(n_nodes - n_logit, n_nodes)])
    if ctx.options.dense:
        adjacency = torch.zeros(n_nodes, n_nodes, dtype=block.dtype)
        adjacency[target_rows, : n_nodes - n_logit] = block
    else:
        adjacency = _rows.RowMatrix(block, target_rows, n_nodes)
    full = lambda v: torch.zeros(n_nodes, dtype=block.dtype).index_put_((target_rows,), v.to(block.dtype))  # noqa: E731
    graph = AttributionGraph(
        tokens=ctx.tokens, features=nodes.features[selected], activations=nodes.activations[selected],
        logit_tokens=nodes.logit_tokens, logit_probabilities=nodes.probs[nodes.logit_tokens].to(block.dtype),
        adjacency=adjacency, values=full(values), bias=full(bias), unselected=full(unselected_rows),
        errors=nodes.errors, n_layers=L, position=ctx.position, n_active=n_active, scan=ctx.tcs.scan,
        centered=ctx.options.centered, zero_positions=tuple(ctx.resolved.zero))
    _check_rows(graph, ctx.model)
    return graph


def _check_rows(graph: AttributionGraph, model: Model) -> None:
    """Every feature and logit row plus its bias and unselected part is the target's value, to rounding."""
    rows, A = graph.target_nodes(), graph.rows()
    size = A.abs().sum(1) + graph.values[rows].abs() + graph.bias[rows].abs() + graph.unselected[rows].abs() + 1.0
    gap = graph.row_gaps()
    eps = torch.finfo(graph.adjacency.dtype).eps
    if bool((gap <= _EPS_FACTOR * eps * size).all()):
        return
    hooked = [n for n, hp in model.hook_dict.items() if hp._forward_hooks]
    why = (f"the run was changed by hooks attached at {hooked[:4]}: remove them (model.reset_hooks())" if hooked
           else "the model has a part the frozen replacement does not follow (e.g. an attention that neither takes its "
                "pattern from attn.hook_pattern nor its output from attn.hook_z)")
    raise ValueError(f"attribution_graph: a row sums to a value {float(gap.max()):.3g} away from its target's own: "
                     f"{why}")
