"""The direct-effect rows of an attribution graph (private): the active feature nodes of a clean run and
the rows (target, source) one batched backward pass through the replacement model gives, over every active
feature, then the error nodes, then the token nodes (:mod:`.attribution`'s module docstring for the formula);
and circuit-tracer's choice of feature nodes, the most influential on the rows computed so far, a round at a time.
Read by :mod:`.attribution` and :mod:`.qk`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .._progress import bar
from . import _replacement as R
from . import _rows
from .transcoders import TranscoderSet

__all__: list[str] = []


def active_nodes(tcs: TranscoderSet, clean: R.Clean, zero: Sequence[int] = ()):
    """The feature nodes of a clean run: every active feature (layer, pos, index) and its activation
    (numbered layer by layer, then by position); and the error vectors (layer, pos, d_model). At the
    positions ``zero`` (circuit-tracer's ``zero_positions``) no feature is a node and the error vectors are 0.
    Active: a nonzero activation; in a layer with a post-encoder bias, every selected feature (it writes ``c W_dec``
    even at activation 0)."""
    feats, acts_list = [], []
    L, (P, d) = len(tcs), clean.embed.shape
    # each MLP output's reconstruction, from every layer writing to it
    recon = torch.zeros(L, P, d, dtype=clean.embed.dtype)
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

    def __init__(self, run: R.GradRun, features, activations, tcs: TranscoderSet, errors, embed, P: int,
                 L: int) -> None:
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
        # features are numbered layer by layer
        self.layer_start = [int((features[:, 0] < l).sum()) for l in range(L + 1)]

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


def feature_rows(rows: Rows, features: torch.Tensor, logit_rows: torch.Tensor, logit_p: torch.Tensor,
                 max_nodes: int | None, batch_size: int, progress: bool,
                 round_size: int | None = None) -> tuple[_rows.FeatureRows, torch.Tensor]:
    """The rows of the selected features (a :class:`~._rows.FeatureRows`, in the order computed) and which
    they are: every active feature, or (``max_nodes``) circuit-tracer's choice, the most influential on the
    rows computed so far, a round at a time."""
    tcs = rows.tcs
    n = len(features)
    n_select = n if max_nodes is None else min(max_nodes, n)
    targets: Callable[[list[int]], list] = lambda idx: [  # noqa: E731
        (int(features[i, 0]), int(features[i, 1]), tcs[int(features[i, 0])].W_enc[int(features[i, 2])].detach())
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
