"""An attribution graph's adjacency kept as its nonzero rows, and the influence, pruning and scores on them (private).

Only feature and logit nodes have inputs, and logit nodes have no outputs: of the ``n_nodes x n_nodes``
adjacency, only the ``n_targets = n_features + n_logits`` rows over the first ``n_sources = n_nodes - n_logits``
columns can be nonzero. :class:`RowMatrix` stores that block and nothing else (at 1,024 tokens on GPT-2
small's shape with 1,024 feature nodes: 1,034 x 14,336 entries instead of 15,370 x 15,370, 14x less), and
answers the reads the rest of the package makes of a dense matrix (``m[t, s]`` pairs, ``m[rows]``,
``nonzero``, ``dense()``). The influence, the pruning and the scores of :mod:`.graph` are computed here on
the block for every graph, dense or not, so a graph gives the same numbers whichever way it is stored
(the ``n_nodes^2`` matrices the pruning used, normalized, masked, scored, sorted, are never formed).

:class:`FeatureRows` holds the rows computed while the feature nodes are chosen, each block of rows only
over the sources that can reach it: a target at layer ``l`` reads no feature of layer ``l`` or later,
and active features are numbered layer by layer, so its row stops at the first feature of layer ``l``.
"""

from __future__ import annotations

import torch

__all__: list[str] = []


class RowMatrix:
    """An ``n_nodes x n_nodes`` matrix stored as its rows ``targets`` over its first ``n_sources`` columns.

    >>> m = RowMatrix(torch.tensor([[1.0, 2.0]]), torch.tensor([2]), 3)
    >>> m.dense().tolist(), m[torch.tensor([2, 0]), torch.tensor([1, 1])].tolist(), m.shape
    ([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 2.0, 0.0]], [2.0, 0.0], (3, 3))
    """

    def __init__(self, values: torch.Tensor, targets: torch.Tensor, n_nodes: int) -> None:
        self.values, self.targets, self.n_nodes = values, targets.long(), int(n_nodes)
        self.row_of = torch.full((self.n_nodes,), -1, dtype=torch.long)
        self.row_of[self.targets] = torch.arange(len(self.targets))

    @property
    def n_sources(self) -> int:
        return self.values.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_nodes, self.n_nodes)

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    def dense(self) -> torch.Tensor:
        out = torch.zeros(self.n_nodes, self.n_nodes, dtype=self.values.dtype)
        out[self.targets, : self.n_sources] = self.values
        return out

    def double(self) -> "RowMatrix":
        return RowMatrix(self.values.double(), self.targets, self.n_nodes)

    def rows(self, index) -> torch.Tensor:
        """Dense rows ``index`` (a node index or a tensor of them): (len, n_nodes)."""
        index = torch.as_tensor(index).long().reshape(-1)
        out = torch.zeros(len(index), self.n_nodes, dtype=self.values.dtype)
        r = self.row_of[index]
        out[r >= 0, : self.n_sources] = self.values[r[r >= 0]]
        return out

    def __getitem__(self, key):
        if isinstance(key, tuple) and len(key) == 2:  # entries m[t, s] (broadcast)
            t, s = (torch.as_tensor(k).long() for k in key)
            t, s = torch.broadcast_tensors(t, s)
            r = self.row_of[t]
            ok = (r >= 0) & (s < self.n_sources)
            out = torch.zeros(t.shape, dtype=self.values.dtype)
            out[ok] = self.values[r[ok], s[ok]]
            return out
        if isinstance(key, int):
            return self.rows(key)[0]
        return self.rows(key)

    def nonzero(self, as_tuple: bool = False):
        r, s = self.values.nonzero(as_tuple=True)
        t = self.targets[r]
        return (t, s) if as_tuple else torch.stack([t, s], 1)

    def sum(self):
        return self.values.sum()

    def count_nonzero(self) -> int:
        return int((self.values != 0).sum())


def block(adjacency, targets: torch.Tensor, n_sources: int) -> torch.Tensor:
    """The (target, source) block of a dense adjacency or a :class:`RowMatrix` (rows in ``targets``' order)."""
    if isinstance(adjacency, RowMatrix):
        if torch.equal(adjacency.targets, targets):
            return adjacency.values
        return adjacency.values[adjacency.row_of[targets]]
    return adjacency[targets, :n_sources]


def normalized(values: torch.Tensor) -> torch.Tensor:
    a = values.abs()
    return a / a.sum(1, keepdim=True).clamp(min=torch.finfo(a.dtype).tiny)


def influence(norm: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``weights (Â + Â² + ...)`` with ``Â`` given as its rows ``targets`` (over the first sources)."""
    n_src = norm.shape[1]

    def times(v: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(v)
        out[:n_src] = v[targets] @ norm
        return out

    step, total = times(weights), torch.zeros_like(weights)
    for _ in range(len(weights) + 1):
        if not bool(step.any()):
            return total
        total, step = total + step, times(step)
    raise ValueError("the graph has a cycle: its influence does not converge")


def threshold(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """The smallest score among the fewest top scores whose sum reaches ``fraction`` of the total."""
    ranked = scores.flatten().sort(descending=True).values
    cumulative = ranked.cumsum(0) / ranked.sum().clamp(min=torch.finfo(ranked.dtype).tiny)
    index = min(int(torch.searchsorted(cumulative, torch.tensor(fraction, dtype=cumulative.dtype))), len(ranked) - 1)
    return ranked[index]


class FeatureRows:
    """The rows of the feature targets computed so far, in the order computed, each block over the sources
    that can reach it (module docstring): ``cut`` active-feature columns, then the error and token columns."""

    def __init__(self, n_active: int, layer_start: list[int], n_tail: int, dtype: torch.dtype) -> None:
        self.n_active, self.layer_start, self.n_tail, self.dtype = n_active, layer_start, n_tail, dtype
        self.blocks: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (cut, features part, tail part)
        self.scales: list[torch.Tensor] = []  # per block, 1 / each row's sum of absolute values (made once)
        self.n_rows = 0

    def add(self, rows: torch.Tensor, layers: list[int]) -> None:
        """Rows over every source (batch, n_active + n_tail), of targets at ``layers``."""
        cut = self.layer_start[max(layers)]
        if bool(rows[:, cut : self.n_active].any()):
            raise ValueError("a feature row reads a feature of its own layer or a later one: "
                             "the model is not causal by layer")
        feats, tail = rows[:, :cut].clone(), rows[:, self.n_active :].clone()
        self.blocks.append((cut, feats, tail))
        self.scales.append(1.0 / (feats.abs().sum(1) + tail.abs().sum(1)).clamp(min=torch.finfo(self.dtype).tiny))
        self.n_rows += len(rows)

    def spread(self, weights: torch.Tensor) -> torch.Tensor:
        """``weights @ normalized(rows)`` over every source (n_active + n_tail)."""
        acc = torch.zeros(self.n_active + self.n_tail, dtype=self.dtype)
        i = 0
        for (cut, feats, tail), scale in zip(self.blocks, self.scales):
            w = weights[i : i + len(feats)] * scale
            for j in range(0, len(feats), 16):  # a few rows at a time: no copy of a block's absolute values
                acc[:cut] += w[j : j + 16] @ feats[j : j + 16].abs()
            acc[self.n_active :] += w @ tail.abs()
            i += len(feats)
        return acc

    def columns(self, keep: torch.Tensor, dropped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows at the active-feature columns ``keep`` then every error and token column, and each row's
        sum over the columns flagged in ``dropped`` (the unselected features)."""
        kept, unselected = [], []
        for cut, feats, tail in self.blocks:
            k = keep[keep < cut]
            part = torch.zeros(len(feats), len(keep), dtype=self.dtype)
            part[:, keep < cut] = feats[:, k]
            kept.append(torch.cat([part, tail], 1))
            unselected.append(feats @ dropped[:cut].to(self.dtype))
        return torch.cat(kept), torch.cat(unselected)
