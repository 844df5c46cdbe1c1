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
from typing import Sequence

import torch
from jaxtyping import Int

from .._backend import Model
from .._progress import DELAY, bar
from ..exact.needs import GRAPH, TRANSCODERS, needs
from . import _conventions as C
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
        raise ValueError(f"tokens must be one prompt of token ids, (pos,) or (1, pos); got shape {tuple(t.shape)}, {t.dtype}")
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


@needs(*GRAPH, "gradients", name="features.attribution_graph", optional=TRANSCODERS,
       refuses=("attention-only", "soft-capped logits"))
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
            :func:`~rs_interp.features.train_transcoder`, :func:`~rs_interp.features.mlp_transcoders`); cast to the model's dtype.
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
    if torch.is_inference_mode_enabled():  # a notebook's usual wrapper: the backward passes need autograd
        with torch.inference_mode(False):
            return attribution_graph(model, transcoders, torch.as_tensor(tokens).clone(), targets=targets, position=position,
                                     max_logits=max_logits, logit_probability=logit_probability, centered=centered,
                                     max_feature_nodes=max_feature_nodes, batch_size=batch_size, progress=progress,
                                     dense=dense, convention=convention, zero_positions=zero_positions,
                                     prepend_bos=prepend_bos, feature_order=feature_order, round_size=round_size)
    given = _tokens(model, tokens)
    opt = C.resolve(model, given, convention, zero_positions, prepend_bos, feature_order, round_size)
    tokens = _tokens(model, opt.tokens)
    R.check_replacement(model, transcoders, "features.attribution_graph")
    model = R.working_copy(model)
    P, L, dt = len(tokens), model.cfg.n_layers, model.cfg.dtype
    if not -len(given) <= int(position) < len(given):
        raise ValueError(f"position must be in [{-len(given)}, {len(given) - 1}], got {position}")
    position = int(position) % len(given) + P - len(given)
    if batch_size < 1 or (max_feature_nodes is not None and max_feature_nodes < 0):
        raise ValueError("batch_size must be >= 1 and max_feature_nodes >= 0")
    tcs = R.working_set(transcoders, dt)
    if progress and tcs[0].k is not None:  # the cost, before the run (TopK: the active features are known from the shapes)
        from tqdm.std import tqdm  # write() only: no widget import (rs_interp._progress)

        from .estimate import estimate_graph, matmul_rate

        rate = matmul_rate(512, 2)  # ~10 ms: a rate for the line written above the bar, not a benchmark's
        cost = estimate_graph(model, tcs, P, max_feature_nodes=max_feature_nodes, max_logits=max_logits, batch_size=batch_size,
                              dense=dense, rate=rate)
        if cost.seconds >= DELAY:  # long work only, as the bars: a short call stays quiet
            tqdm.write(str(cost), file=sys.stderr)  # where the bars go: a script's stdout stays its own
    with R.quiet_model(model):
        clean = R.clean_run(model, tcs, tokens[None])
        probs = clean.logits[position].double().softmax(-1)
        logit_tokens = _logit_targets(probs, targets, max_logits, logit_probability)
        features, activations, errors = active_nodes(tcs, clean, opt.zero)
        W_U = model.W_U.detach().to(dt)
        logit_reads = (W_U[:, logit_tokens] - (W_U.mean(1, keepdim=True) if centered else 0.0)).T  # (logit, d_model)
        n_active = len(features)
        with torch.enable_grad():
            run = R.grad_forward(model, tcs, tokens[None], patterns=clean.frozen)
            rows = Rows(run, features, activations, tcs, errors, clean.embed, P, L)
            logit_rows = rows.compute([(L, position, v) for v in logit_reads], batch_size)
            feature_rows, selected = _feature_rows(rows, features, tcs, logit_rows, probs[logit_tokens],
                                                   max_feature_nodes, batch_size, progress, opt.round_size)
        del run, rows
        computed = selected  # the rows' order; the nodes': as computed, or (circuit-tracer's) the active order
        if opt.feature_order == "index":
            selected = selected.sort().values
        values, bias = _values_and_bias(model, tcs, clean, tokens, features[selected], logit_tokens, position, centered,
                                        opt.zero)
    return _assemble(features, activations, selected, feature_rows, logit_rows, logit_tokens, probs, values, bias,
                     tokens, errors, L, position, n_active, tcs.scan, centered, model, dense, opt.zero, computed)


def active_nodes(tcs: TranscoderSet, clean: R.Clean, zero: Sequence[int] = ()):
    """The feature nodes of a clean run: every active feature (layer, pos, index) and its activation
    (numbered layer by layer, then by position); and the error vectors (layer, pos, d_model). At the
    positions ``zero`` (circuit-tracer's ``zero_positions``) no feature is a node and the error vectors are 0.
    Active: a nonzero activation; in a layer with a post-encoder bias, every selected feature (it writes ``c W_dec``
    even at activation 0)."""
    feats, acts_list = [], []
    L, (P, d) = len(tcs), clean.embed.shape
    recon = torch.zeros(L, P, d, dtype=clean.embed.dtype)  # each MLP output's reconstruction, from every layer writing to it
    with torch.no_grad():
        for l, tc in enumerate(tcs):
            x = clean.inputs[l]
            acts = tc.encode(x)
            acts[list(zero)] = 0.0
            if tc.post_bias is None:
                active = acts
            else:  # every selected feature is a node (zeros included): it writes c W_dec
                active = tc.selected(x).index_fill_(0, torch.tensor(list(zero), dtype=torch.long), False)
            pos, idx = active.nonzero(as_tuple=True)
            feats.append(torch.stack([torch.full_like(pos, l), pos, idx], 1))
            acts_list.append(acts[pos, idx])
            for (out, W), v in zip(tcs.writes_from(l), _post_values(tcs, l, acts, active)):
                recon[out] += v @ W
            del acts
        errors = torch.stack([clean.outputs[l] - (recon[l] + tc.b_dec + tcs.skip_into(l, clean.inputs))
                              for l, tc in enumerate(tcs)])
        errors[:, list(zero)] = 0.0
    return torch.cat(feats), torch.cat(acts_list), errors


def _post_values(tcs: TranscoderSet, layer: int, acts: torch.Tensor, active: torch.Tensor) -> list[torch.Tensor]:
    """What each of ``layer``'s decoders reads: ``acts`` plus the post-encoder bias on the ``active`` (selected, not
    zeroed) features."""
    return [acts if c is None else acts + active.to(acts.dtype) * c for c in tcs.post_biases_from(layer)]


class Rows:
    """Direct-effect rows from batched backward passes through one :func:`~._replacement.grad_forward` run."""

    def __init__(self, run: R.GradRun, features, activations, tcs: TranscoderSet, errors, embed, P: int, L: int) -> None:
        self.run, self.P, self.L = run, P, L
        self.errors, self.embed = errors, embed
        self.activations, self.tcs, self.index = activations, tcs, features[:, 2]
        # per output layer: (source layer, decoder, post-encoder bias or None)
        self.into: list[list[tuple[int, torch.Tensor, torch.Tensor | None]]] = [[] for _ in range(L)]
        for src in range(L):
            for (out, W), c in zip(tcs.writes_from(src), tcs.post_biases_from(src)):
                self.into[out].append((src, W, c))
        # per layer: the feature nodes' columns, grouped by position for one small matmul per position
        self.groups = []
        for l in range(L):
            cols = (features[:, 0] == l).nonzero()[:, 0]
            self.groups.append([(p, cols[features[cols, 1] == p]) for p in features[cols, 1].unique().tolist()])
        self.n_features = len(features)
        self.layer_start = [int((features[:, 0] < l).sum()) for l in range(L + 1)]  # features are numbered layer by layer

    def compute(self, targets: list[tuple[int, int, torch.Tensor]], batch_size: int) -> torch.Tensor:
        """Rows (target, source) for targets ``(layer, pos, read vector)`` (layer ``L``: the final stream),
        over every active feature, then error nodes, then tokens."""
        out = torch.zeros(len(targets), self.n_features + (self.L + 1) * self.P, dtype=self.embed.dtype)
        for start in range(0, len(targets), batch_size):
            batch = targets[start : start + batch_size]
            out[start : start + len(batch)] = self._batch(batch)
        return out

    def _batch(self, batch) -> torch.Tensor:
        B, run = len(batch), self.run
        points = run.inputs + [run.final]
        injected: dict[int, torch.Tensor] = {}
        for b, (layer, pos, vector) in enumerate(batch):
            if layer not in injected:
                injected[layer] = torch.zeros(B, *points[layer].shape, dtype=points[layer].dtype)
            injected[layer][b, 0, pos] = vector.to(points[layer].dtype)
        layers = sorted(injected)
        return self.backward([points[l] for l in layers], [injected[l] for l in layers])

    def backward(self, tensors: list[torch.Tensor], grad_outputs: list[torch.Tensor]) -> torch.Tensor:
        """The rows (batch, source) of the targets ``sum (grad_outputs * tensors)``, one per batch row of
        ``grad_outputs`` (each shaped (batch, *tensor.shape)): each source's write dotted with the
        target's gradient at its write point."""
        B, run = grad_outputs[0].shape[0], self.run
        grads = torch.autograd.grad(tensors, run.outputs + [run.embed], grad_outputs,
                                    retain_graph=True, allow_unused=True, is_grads_batched=True)
        with torch.no_grad():  # the writes are made here from the transcoders' parameters: no graph for them
            return self._rows(grads, B)

    def _rows(self, grads, B: int) -> torch.Tensor:
        row = torch.zeros(B, self.n_features + (self.L + 1) * self.P, dtype=self.embed.dtype)
        err0 = self.n_features
        for l in range(self.L):
            g = grads[l]
            if g is None:
                continue
            g = g[:, 0].to(row.dtype)  # (B, pos, d_model)
            for src, W_dec, c in self.into[l]:  # every layer whose features write into this MLP output
                for p, cols in self.groups[src]:  # the writes a W_dec[i] of one position, made here (never all at once)
                    a = self.activations[cols] if c is None else self.activations[cols] + c[self.index[cols]]
                    a = a[:, None]
                    row[:, cols] += g[:, p] @ (a * W_dec[self.index[cols]]).T
            row[:, err0 + l * self.P : err0 + (l + 1) * self.P] = (g * self.errors[l]).sum(-1)
        if grads[-1] is not None:
            row[:, err0 + self.L * self.P :] = (grads[-1][:, 0].to(row.dtype) * self.embed).sum(-1)
        return row


def _feature_rows(rows: Rows, features, tcs, logit_rows, logit_p, max_nodes, batch_size, progress, round_size=None):
    """The rows of the selected features (a :class:`~._rows.FeatureRows`, in the order computed) and which
    they are: every active feature, or (``max_nodes``) circuit-tracer's choice, the most influential on the
    rows computed so far, a round at a time."""
    n = len(features)
    n_select = n if max_nodes is None else min(max_nodes, n)
    targets = lambda idx: [(int(features[i, 0]), int(features[i, 1]), tcs[int(features[i, 0])].W_enc[int(features[i, 2])].detach())  # noqa: E731
                           for i in idx]
    out = _rows.FeatureRows(n, rows.layer_start, logit_rows.shape[1] - n, logit_rows.dtype)
    order: list[int] = []
    visited = torch.zeros(n, dtype=torch.bool)
    # a round: the features chosen from one influence estimate (at most ~8 rounds: each estimate reads every row so far)
    per_round = n_select if n_select == n else round_size or max(4 * batch_size, -(-n_select // 8))
    with bar(total=n_select, desc="feature rows", enabled=progress) as rows_bar:
        while len(order) < n_select:
            if n_select == n:
                pending = list(range(n))
            else:
                infl = _partial_influence(logit_rows, logit_p, out, order)
                rank = infl[:n].argsort(descending=True)
                pending = rank[~visited[rank]][: min(per_round, n_select - len(order))].tolist()
                # a backward pass costs as much as its deepest target: batch a round's features layer by layer
                pending.sort(key=lambda i: (int(features[i, 0]), int(features[i, 1])))
            for start in range(0, len(pending), batch_size):
                idx = pending[start : start + batch_size]
                out.add(rows.compute(targets(idx), batch_size), [int(features[i, 0]) for i in idx])
                order += idx
                rows_bar.update(len(idx))
            visited[pending] = True
    return out, torch.tensor(order, dtype=torch.long)


def _partial_influence(logit_rows, logit_p, feature_rows: _rows.FeatureRows, order) -> torch.Tensor:
    """Each node's influence on the logits through the rows known so far (the logits', then the
    computed features'), each row's absolute values scaled to sum 1."""
    a = logit_rows.abs()
    step = (logit_p.to(a.dtype) / a.sum(1).clamp(min=torch.finfo(a.dtype).tiny)) @ a
    node = torch.tensor(order, dtype=torch.long)
    total = step.clone()
    for _ in range(len(order) + 1):  # the graph is acyclic: the walk ends
        if len(order) == 0:
            break
        step = feature_rows.spread(step[node])
        if not bool(step.any()):
            break
        total += step
    return total


def _values_and_bias(model, tcs, clean, tokens, feats, logit_tokens, position, centered, zero_positions=()):
    """Each target's value in the run and its constant part, from the frozen model with every node off
    (no token embedding; each MLP writes only its transcoder's ``b_dec`` and skip, and at ``zero_positions``
    what no node there carries: :func:`._conventions.frozen_outputs`)."""
    zero = torch.zeros_like(clean.embed)
    inputs, logits = R.frozen_forward(model, tcs, clean, tokens[None], embed=zero,
                                      outputs=C.frozen_outputs(tcs, clean, zero_positions))

    def read(ins, lg):
        pre = [(ins[int(l)][int(p)] @ tcs[int(l)].W_enc[int(f)] + tcs[int(l)].b_enc[int(f)]) for l, p, f in feats.tolist()]
        last = lg[position] - (lg[position].mean() if centered else 0.0)
        return torch.cat([torch.stack(pre).to(lg.dtype) if pre else torch.zeros(0, dtype=lg.dtype), last[logit_tokens]])

    with torch.no_grad():
        return read(list(clean.inputs), clean.logits), read(inputs, logits)


def _assemble(features, activations, selected, feature_rows, logit_rows, logit_tokens, probs, values, bias, tokens, errors,
              L, position, n_active, scan, centered, model, dense, zero=(), computed=None) -> AttributionGraph:
    n_sel, P, n_logit = len(selected), len(tokens), len(logit_tokens)
    n_nodes = n_sel + (L + 1) * P + n_logit
    dropped = torch.ones(n_active, dtype=logit_rows.dtype)
    dropped[selected] = 0.0
    kept, unselected_features = feature_rows.columns(selected, dropped)  # (rows as computed, selected + errors + tokens)
    if computed is not None and not torch.equal(computed, selected):  # the rows in the nodes' order
        where = torch.empty(n_active, dtype=torch.long)
        where[computed] = torch.arange(len(computed))
        kept, unselected_features = kept[where[selected]], unselected_features[where[selected]]
    keep = torch.cat([selected, torch.arange(n_active, n_active + (L + 1) * P)])  # the logit rows' columns kept
    unselected_rows = torch.cat([unselected_features, logit_rows[:, :n_active] @ dropped])
    block = torch.cat([kept, logit_rows[:, keep]])  # every row that can be nonzero: the features', then the logits'
    del kept
    target_rows = torch.cat([torch.arange(n_sel), torch.arange(n_nodes - n_logit, n_nodes)])
    if dense:
        adjacency = torch.zeros(n_nodes, n_nodes, dtype=block.dtype)
        adjacency[target_rows, : n_nodes - n_logit] = block
    else:
        adjacency = _rows.RowMatrix(block, target_rows, n_nodes)
    full = lambda v: torch.zeros(n_nodes, dtype=block.dtype).index_put_((target_rows,), v.to(block.dtype))  # noqa: E731
    graph = AttributionGraph(
        tokens=tokens, features=features[selected], activations=activations[selected], logit_tokens=logit_tokens,
        logit_probabilities=probs[logit_tokens].to(block.dtype), adjacency=adjacency, values=full(values),
        bias=full(bias), unselected=full(unselected_rows), errors=errors, n_layers=L, position=position, n_active=n_active,
        scan=scan, centered=centered, zero_positions=tuple(zero))
    _check_rows(graph, model)
    return graph


def _check_rows(graph: AttributionGraph, model: Model) -> None:
    """Every feature and logit row plus its bias and unselected part is the target's value, to rounding."""
    rows, A = graph.target_nodes(), graph.rows()
    total = A.sum(1) + graph.unselected[rows] + graph.bias[rows]
    size = A.abs().sum(1) + graph.values[rows].abs() + graph.bias[rows].abs() + graph.unselected[rows].abs() + 1.0
    gap = (total - graph.values[rows]).abs()
    eps = torch.finfo(graph.adjacency.dtype).eps
    if bool((gap <= _EPS_FACTOR * eps * size).all()):
        return
    hooked = [n for n, hp in model.hook_dict.items() if hp._forward_hooks]
    why = (f"the run was changed by hooks attached at {hooked[:4]}: remove them (model.reset_hooks())" if hooked
           else "the model has a part the frozen replacement does not follow (e.g. an attention that neither takes its "
                "pattern from attn.hook_pattern nor its output from attn.hook_z)")
    raise ValueError(f"attribution_graph: a row sums to a value {float(gap.max()):.3g} away from its target's own: {why}")
