"""How far to trust an estimate: its spread over pairs, its reliability, a bootstrap, and stability.

Every gradient estimate here is a sum over the pairs ``(tokens[b], reference[b])`` of each pair's
*share* (its batch row's part of the contraction ``w . g``), computed in the same passes
(``per_example=True``): the shares add up to the estimate exactly. From them:

- the **standard error** over pairs, ``SE = sqrt(B) sd_b(share_b)`` (``sd`` with ``B - 1``): the
  spread of a sum of ``B`` independent terms, what the estimate would move by on another draw of
  ``B`` pairs; the **error bar** ``z SE`` (``z = 1.96``: 95% under a normal spread). It measures the
  sampling spread only, not how far a first-order estimate is from the patch it estimates: that is
  the **reliability** (:mod:`rs_interp.circuits.correction`);
- a **bootstrap** over pairs (:func:`bootstrap`): the estimate on ``n`` resamples of the pairs with
  replacement, ``B / B`` times the sum of the resampled shares (exactly the estimate on the resampled
  batch for a metric that averages per-pair terms, as the next-token loss does with equal counts), each
  edge's **inclusion frequency** in the resamples' top ``k`` and each resample's top-``k``
  **Jaccard** index with the full sample's;
- **stability** across settings (:func:`stability`; Meloux et al. 2025, CIRCUS 2026): given one
  result per setting (steps, rules, pairs), each edge's fraction of top-``k`` sets that hold it and the
  settings' pairwise Jaccard indices.

>>> j = jaccard({("a", "b"), ("c", "d")}, {("a", "b")})
>>> j
0.5
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float, Int

from ..exact.validate import check_int_range
from .graph import EdgeEffects, EdgeLayout
from .selection import RANKINGS, Ranking

__all__ = ["Spread", "Bootstrap", "Stability", "bootstrap", "stability", "jaccard", "Z95", "FLAT"]

#: The normal quantile of a two-sided 95% error bar.
Z95 = 1.959963984540054
#: Terms at most this fraction of the largest count as vanishing (the ground truth's noise floor).
FLAT = 1e-9


def jaccard(a: set, b: set) -> float:
    """``|a & b| / |a | b|`` (1 for two empty sets)."""
    a, b = set(a), set(b)
    return 1.0 if not a and not b else len(a & b) / len(a | b)


class Spread:
    """What a result with per-pair shares (``per_example``) and, when corrected, its first-order
    part (``first_order``) says about its own numbers (a mixin of the node and edge results)."""

    def stderr(self) -> torch.Tensor:
        """Per item, the standard error over pairs, ``sqrt(B) sd_b(share_b)`` (module docstring).

        Raises:
            ValueError: computed without ``per_example=True``, or from a single pair.
        """
        shares = getattr(self, "per_example", None)
        if shares is None:
            raise ValueError("the standard error needs each pair's share: call the estimate with per_example=True")
        B = shares.shape[0]
        if B < 2:
            raise ValueError("a standard error over pairs needs at least 2 pairs, got 1")
        return shares.std(0, unbiased=True) * B**0.5

    def error_bar(self, z: float = Z95) -> torch.Tensor:
        """Per item, the half-width ``z SE`` of the error bar (``z = 1.96``: 95% under a normal
        spread). The sampling spread only: see :meth:`reliability` for the linearisation."""
        if not (isinstance(z, (int, float)) and z > 0):
            raise ValueError(f"z must be a positive number, got {z!r}")
        return z * self.stderr()

    def reliability(self) -> torch.Tensor:
        """Per item, ``|first| / (|first| + |second|)``: the share of the corrected estimate's size
        that the first-order term carries (``second = effect - first_order``, the Hessian term). 1: the
        correction vanishes; below 1/2: the correction is the larger, and the first-order estimate is not
        to be trusted. 0 where both terms vanish (``|first| + |second|`` at most :data:`FLAT` of its
        largest over the items): a flat region, where every derivative is 0 and an expansion says
        nothing about the patch (a saturated softmax, a discretising MLP's plateau), is flagged too.

        Raises:
            ValueError: the estimate was not corrected (``correction="hessian"``).
        """
        first = getattr(self, "first_order", None)
        if first is None:
            raise ValueError("the reliability compares the first- and second-order terms: call the estimate with "
                             "correction='hessian'")
        a, b = first.abs(), (self.effect - first).abs()
        total = a + b
        top = float(total.nan_to_num(0).max())
        flat = total <= FLAT * top
        return torch.where(flat, 0.0, a / torch.where(flat, 1.0, total)).where(~self.effect.isnan(), float("nan"))


@dataclass(frozen=True)
class Bootstrap:
    """Edge estimates on resamples of the pairs (:func:`bootstrap`).

    Attributes:
        layout: the edge graph.
        effect: (resample, sender, receiver) the estimate on each resample.
        resamples: (resample, batch) the pairs each resample drew.
        inclusion: (sender, receiver) the fraction of resamples whose top ``k`` holds the edge (NaN
            where there is no edge).
        jaccard: (resample,) each resample's top-``k`` Jaccard index with the full sample's top ``k``.
        k, ranking: the top-``k`` sets compared, and how they are ranked.

    Example:
        >>> import rs_interp
        >>> model = rs_interp.load_toy_model("induction-1l")
        >>> a, b = rs_interp.induction_batch(8, seed=0).tokens, rs_interp.induction_batch(8, seed=1).tokens
        >>> metric = lambda lg: lg[:, -1, 0].mean()
        >>> eap = rs_interp.edge_attribution_patching(model, a, metric, reference=b, per_example=True)
        >>> boot = rs_interp.bootstrap(eap, n_resamples=20, k=3)
        >>> tuple(boot.resamples.shape), bool((boot.jaccard <= 1).all())
        ((20, 8), True)
    """

    layout: EdgeLayout
    effect: Float[torch.Tensor, "resample sender receiver"]
    resamples: Int[torch.Tensor, "resample batch"]
    inclusion: Float[torch.Tensor, "sender receiver"]
    jaccard: Float[torch.Tensor, " resample"]
    k: int
    ranking: str

    @property
    def mean_jaccard(self) -> float:
        """The mean top-``k`` Jaccard index over the resamples."""
        return float(self.jaccard.mean())

    def interval(self, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
        """Per edge, the percentile interval of the resampled estimates holding ``level`` of them."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level!r}")
        q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=self.effect.dtype)
        lo, hi = torch.quantile(self.effect, q, dim=0)
        return lo, hi


def _top_set(layout: EdgeLayout, effect: torch.Tensor, k: int, ranking: str) -> set[int]:
    return set(EdgeEffects(layout, effect, 0.0).ranked(ranking)[:k])


def bootstrap(scores: EdgeEffects, *, n_resamples: int = 100, k: int = 10, ranking: Ranking = "absolute", seed: int = 0,
              resamples: torch.Tensor | None = None) -> Bootstrap:
    """A bootstrap over pairs of edge estimates, from their per-pair shares (module docstring): no
    further pass through the model.

    Args:
        scores: edge estimates computed with ``per_example=True`` (e.g. :func:`rs_interp.edge_attribution_patching`).
        n_resamples: how many resamples of the ``B`` pairs, with replacement.
        k: the size of the top sets compared (Jaccard, inclusion).
        ranking: ``"absolute"`` or ``"signed"`` (as :meth:`rs_interp.EdgeEffects.ranked`).
        seed: the resamples' generator seed.
        resamples: (resample, B) the pairs of each resample, given (instead of drawn).

    Raises:
        ValueError: scores without shares, bad sizes or ranking, resamples out of range.

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(8, seed=0).tokens, ri.induction_batch(8, seed=1).tokens
        >>> eap = ri.edge_attribution_patching(model, a, lambda lg: lg[:, -1, 0].mean(), reference=b, per_example=True)
        >>> boot = bootstrap(eap, n_resamples=20, k=5)
        >>> tuple(boot.effect.shape), 0 <= boot.mean_jaccard <= 1
        ((20, 5, 13), True)
    """
    shares = getattr(scores, "per_example", None)
    if not isinstance(scores, EdgeEffects) or shares is None:
        raise ValueError("bootstrap resamples each pair's share of an edge estimate: pass an estimate computed with "
                         "per_example=True")
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")
    B = shares.shape[0]
    k = check_int_range("k", k, 1, scores.layout.n_edges)
    if resamples is None:
        n = check_int_range("n_resamples", n_resamples, 1)
        resamples = torch.randint(0, B, (n, B), generator=torch.Generator().manual_seed(seed))
    else:
        resamples = torch.as_tensor(resamples)
        if (resamples.ndim != 2 or resamples.dtype.is_floating_point
                or bool((resamples < 0).any() | (resamples >= B).any())):
            raise ValueError(f"resamples must be an integer (resample, draws) tensor of pair indices in [0, {B - 1}]")
    # B / draws times the resampled shares' sum: the estimate's scale whatever the draws' count.
    effect = shares[resamples].sum(1) * (B / resamples.shape[1])
    full = _top_set(scores.layout, scores.effect, k, ranking)
    tops = [_top_set(scores.layout, e, k, ranking) for e in effect]
    inclusion = torch.zeros(scores.layout.n_edges, dtype=torch.float64)
    for t in tops:
        inclusion[list(t)] += 1
    grid = torch.full(scores.effect.shape, float("nan"), dtype=torch.float64)
    grid[scores.layout.exists] = inclusion / len(tops)
    overlap = torch.tensor([jaccard(full, t) for t in tops], dtype=torch.float64)
    return Bootstrap(scores.layout, effect, resamples, grid, overlap, k, ranking)


@dataclass(frozen=True)
class Stability:
    """How much the top edges of several results agree (:func:`stability`).

    Attributes:
        layout: the edge graph.
        inclusion: (sender, receiver) the fraction of the results whose top ``k`` holds the edge
            (CIRCUS's retention frequency; NaN where there is no edge).
        jaccard: (result, result) the pairwise top-``k`` Jaccard indices.
        k, ranking: the top sets compared.

    Example:
        >>> import rs_interp
        >>> model = rs_interp.load_toy_model("induction-1l")
        >>> a, b = rs_interp.induction_batch(4, seed=0).tokens, rs_interp.induction_batch(4, seed=1).tokens
        >>> metric = lambda logits: logits[:, -1, 0].mean()
        >>> runs = [rs_interp.edge_attribution_patching(model, a, metric, reference=b, ig_steps=m) for m in (1, 3)]
        >>> s = rs_interp.stability(runs, k=3)
        >>> tuple(s.jaccard.shape), 0 <= s.mean_jaccard <= 1
        ((2, 2), True)
    """

    layout: EdgeLayout
    inclusion: Float[torch.Tensor, "sender receiver"]
    jaccard: Float[torch.Tensor, "result result"]
    k: int
    ranking: str

    @property
    def mean_jaccard(self) -> float:
        """The mean Jaccard index over the distinct pairs of results (1 for a single result)."""
        n = self.jaccard.shape[0]
        return 1.0 if n == 1 else float((self.jaccard.sum() - n) / (n * (n - 1)))

    def stable_edges(self, at_least: float = 0.5) -> list[tuple[str, str]]:
        """The edges in at least ``at_least`` of the top sets, by frequency (then the graph's order)."""
        freq = self.inclusion[self.layout.exists]
        order = freq.argsort(descending=True, stable=True)
        edges = self.layout.edges()
        return [edges[i] for i in order.tolist() if float(freq[i]) >= at_least]


def stability(results: Sequence[EdgeEffects], *, k: int = 10, ranking: Ranking = "absolute") -> Stability:
    """The agreement of several edge results of one model (one per setting: steps, rules, pairs,
    methods): each edge's frequency in their top ``k`` and their pairwise Jaccard indices.

    Example:
        >>> import rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
        >>> m = lambda lg: lg[:, -1, 0].mean()
        >>> runs = [ri.edge_attribution_patching(model, a, m, reference=b, ig_steps=s) for s in (None, 2, 4)]
        >>> st = stability(runs, k=5)
        >>> tuple(st.jaccard.shape), float(st.jaccard[0, 0])
        ((3, 3), 1.0)
    """
    results = list(results)
    if not results or not all(isinstance(r, EdgeEffects) for r in results):
        raise ValueError("results must be a non-empty sequence of edge results (EdgeEffects)")
    layout = results[0].layout
    if any(r.layout.senders != layout.senders or r.layout.receivers != layout.receivers for r in results):
        raise ValueError("results must share one model's edge layout")
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")
    k = check_int_range("k", k, 1, layout.n_edges)
    tops = [_top_set(layout, r.effect, k, ranking) for r in results]
    counts = torch.zeros(layout.n_edges, dtype=torch.float64)
    for t in tops:
        counts[list(t)] += 1
    grid = torch.full(layout.exists.shape, float("nan"), dtype=torch.float64)
    grid[layout.exists] = counts / len(tops)
    J = torch.tensor([[jaccard(a, b) for b in tops] for a in tops], dtype=torch.float64)
    return Stability(layout, grid, J, k, ranking)
