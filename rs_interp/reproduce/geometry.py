"""The residual-stream geometry lab: attention collapse and the skip, LayerNorm, the identity path.

Theory, first half. Matrices act on the right (``x -> x W``); a cloud ``X`` has one token per row.

- Definition 2: the Dobrushin coefficient ``tau(A) = 1/2 max_ij ||A_i - A_j||_1
  = 1 - min_ij sum_k min(A_ik, A_jk)`` of a row-stochastic ``A``.
- Theorem 1: ``diam(AX) <= tau(A) diam(X)`` in every norm; ``tau(softmax S) <= 1 - exp(-r)`` when
  every row of ``S`` has range ``<= r``; the pure stack ``X_{l+1} = A_l X_l W_l`` shrinks the
  diameter at least geometrically.
- Proposition 2: with the skip, ``X' = X + A X W``, ``diam(X') >= (1 - tau ||W||) diam(X)``.
- Proposition 3 / Corollary 1: ``LN(x) = sqrt(d) Px/||Px||`` and its Jacobian.
- Theorem 2 (i): the Jacobian of a residual stack is a sum over subsets of layers.

>>> A = torch.tensor([[0.9, 0, 0.1], [0.91, 0, 0.09], [0.9, 0, 0.1]], dtype=torch.float64)
>>> round(float(dobrushin_coefficient(A)), 12)
0.01
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from jaxtyping import Float

__all__ = [
    "dobrushin_coefficient",
    "diameter",
    "operator_norm",
    "attention_matrix",
    "CollapseRun",
    "collapse_run",
    "collapse_cloud",
    "centering_projection",
    "layer_norm",
    "rms_norm",
    "layer_norm_jacobian",
    "SubsetExpansion",
    "residual_jacobian_expansion", "count_clusters"]

Norm = float | int | str


def dobrushin_coefficient(A: Float[torch.Tensor, "n n"], *, form: str = "tv") -> torch.Tensor:
    """tau(A) of a row-stochastic matrix (Definition 2), in either of its two equal forms.

    ``form="tv"``: half the largest l1 distance between two rows; ``form="overlap"``: one minus
    the smallest overlap ``sum_k min(A_ik, A_jk)``. Batched over leading dimensions.
    """
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"A must be a square (n, n) matrix (optionally batched), got {tuple(A.shape)}")
    rows_i, rows_j = A[..., :, None, :], A[..., None, :, :]
    if form == "tv":
        return 0.5 * (rows_i - rows_j).abs().sum(-1).flatten(-2).amax(-1)
    if form == "overlap":
        return 1 - torch.minimum(rows_i, rows_j).sum(-1).flatten(-2).amin(-1)
    raise ValueError(f"form must be 'tv' or 'overlap', got {form!r}")


def _p(p: Norm) -> float:
    if p in (1, 2):
        return float(p)
    if p in ("inf", float("inf"), math.inf):
        return math.inf
    raise ValueError(f"p must be 1, 2 or 'inf', got {p!r}")


def diameter(X: Float[torch.Tensor, "n d"], p: Norm = 2) -> torch.Tensor:
    """``diam(X) = max_ij ||x_i - x_j||_p`` for p in {1, 2, inf} (batched over leading dimensions)."""
    diffs = X[..., :, None, :] - X[..., None, :, :]
    return torch.linalg.vector_norm(diffs, ord=_p(p), dim=-1).flatten(-2).amax(-1)


def operator_norm(W: Float[torch.Tensor, "d d"], p: Norm = 2) -> torch.Tensor:
    """Operator norm of the row-vector map ``x -> x W`` in l_p.

    l1: the largest absolute row sum of W; l-inf: the largest absolute column sum; l2: the
    largest singular value.
    """
    q = _p(p)
    if q == 1:
        return W.abs().sum(-1).amax(-1)
    if q == math.inf:
        return W.abs().sum(-2).amax(-1)
    return torch.linalg.matrix_norm(W, ord=2)


def attention_matrix(X: Float[torch.Tensor, "n d"], beta: float) -> Float[torch.Tensor, "n n"]:
    """``softmax(beta X X^T)`` row by row: queries, keys and values are the tokens themselves."""
    return torch.softmax(beta * X @ X.transpose(-1, -2), dim=-1)


def collapse_cloud(seed: int = 0, n: int = 10, d: int = 2) -> Float[torch.Tensor, "n d"]:
    """The laboratory's cloud: ``n`` tokens in ``R^d`` drawn from a standard normal (float64, seeded).

    The theory's own cloud is not published; ours is ``torch.randn(n, d)`` from a generator seeded
    with ``seed``.
    """
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@dataclass(frozen=True)
class CollapseRun:
    """One run of the smoothing stack, per layer ``l = 0..L`` (index 0 is the input).

    Attributes:
        beta: inverse temperature.
        skip: whether the stack adds the token back (``X + A X``).
        clouds: (L+1, n, d) the token positions.
        diameter: (L+1,) l2 diameters.
        tau: (L,) Dobrushin coefficient of each layer's attention.
        bound: (L+1,) Theorem 1 (iii): ``prod_{k<l} tau_k ||W_k|| diam(X_0)`` (W = I).
        relative_spread: (L+1,) ``||X - 1 xbar^T||_F / ||X||_F``.
    """

    beta: float
    skip: bool
    clouds: torch.Tensor
    diameter: torch.Tensor
    tau: torch.Tensor
    bound: torch.Tensor
    relative_spread: torch.Tensor


def collapse_run(X0: Float[torch.Tensor, "n d"], beta: float, *, n_layers: int = 12, skip: bool = False) -> CollapseRun:
    """Push a cloud through ``n_layers`` of ``A_l = softmax(beta X_l X_l^T)`` with ``W = I``.

    >>> run = collapse_run(collapse_cloud(), 0.5)
    >>> bool((run.diameter <= run.bound + 1e-12).all())
    True
    """
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    clouds, taus = [X0], []
    X = X0
    for _ in range(n_layers):
        A = attention_matrix(X, beta)
        taus.append(dobrushin_coefficient(A))
        X = X + A @ X if skip else A @ X
        clouds.append(X)
    stack = torch.stack(clouds)
    tau = torch.stack(taus)
    diam = diameter(stack)
    bound = diam[0] * torch.cat([torch.ones(1, dtype=tau.dtype), torch.cumprod(tau, 0)])
    centered = stack - stack.mean(-2, keepdim=True)
    spread = torch.linalg.matrix_norm(centered) / torch.linalg.matrix_norm(stack)
    return CollapseRun(beta=beta, skip=skip, clouds=stack, diameter=diam, tau=tau, bound=bound, relative_spread=spread)


def count_clusters(X: Float[torch.Tensor, "n d"], *, frac: float = 0.05) -> int:
    """Clusters of a cloud: tokens closer than ``frac`` of its diameter are joined (single linkage).

    >>> count_clusters(torch.tensor([[0.0, 0.0], [0.0, 0.01], [5.0, 5.0]]))
    2
    """
    dist = torch.cdist(X, X)
    near = dist <= frac * dist.max()
    label = torch.arange(X.shape[0])
    for _ in range(X.shape[0]):  # propagate the smallest label along "near" until nothing changes
        new = torch.where(near, label[None, :], X.shape[0]).amin(-1)
        if torch.equal(new, label):
            break
        label = new
    return int(label.unique().numel())


def centering_projection(d: int, dtype: torch.dtype = torch.float64) -> Float[torch.Tensor, "d d"]:
    """``P = I - 1 1^T / d``, the orthogonal projection onto the hyperplane orthogonal to ``1``."""
    return torch.eye(d, dtype=dtype) - torch.full((d, d), 1.0 / d, dtype=dtype)


def layer_norm(x: Float[torch.Tensor, "... d"]) -> Float[torch.Tensor, "... d"]:
    """LayerNorm with gain 1, bias 0 and no epsilon (Definition 3): ``(x - mu 1) / sigma``."""
    c = x - x.mean(-1, keepdim=True)
    return c / c.pow(2).mean(-1, keepdim=True).sqrt()


def rms_norm(x: Float[torch.Tensor, "... d"]) -> Float[torch.Tensor, "... d"]:
    """RMSNorm without gain or epsilon: ``sqrt(d) x / ||x||``."""
    return math.sqrt(x.shape[-1]) * x / x.norm(dim=-1, keepdim=True)


def layer_norm_jacobian(x: Float[torch.Tensor, " d"]) -> Float[torch.Tensor, "d d"]:
    """Corollary 1: ``dLN/dx = sqrt(d)/||Px|| (P - u u^T)``, ``u = Px/||Px||``."""
    d = x.shape[-1]
    P = centering_projection(d, x.dtype)
    c = P @ x
    u = c / c.norm()
    return math.sqrt(d) / c.norm() * (P - torch.outer(u, u))


@dataclass(frozen=True)
class SubsetExpansion:
    """Theorem 2 (i) for one residual stack.

    Attributes:
        product: ``(I + J_{L-1}) ... (I + J_l)``, the chain rule's Jacobian.
        terms: one ``J_{k_m} ... J_{k_1}`` per subset (2^(L-l) of them), keyed by the subset.
        autograd: the Jacobian of the whole stack from autograd.
    """

    product: torch.Tensor
    terms: dict[tuple[int, ...], torch.Tensor]
    autograd: torch.Tensor

    def total(self) -> torch.Tensor:
        return torch.stack(list(self.terms.values())).sum(0)


def residual_jacobian_expansion(fs: Sequence[Callable[[torch.Tensor], torch.Tensor]],
                                x: Float[torch.Tensor, " d"]) -> SubsetExpansion:
    """Jacobian of ``x_{k+1} = x_k + f_k(x_k)`` as a product and as a sum over subsets of layers."""
    from torch.autograd.functional import jacobian

    xs, Js = [x], []
    for f in fs:
        Js.append(jacobian(f, xs[-1]))
        xs.append(xs[-1] + f(xs[-1]))
    eye = torch.eye(x.shape[-1], dtype=x.dtype)
    product = eye
    for J in Js:
        product = (eye + J) @ product
    terms = {}
    for m in range(len(fs) + 1):
        for subset in itertools.combinations(range(len(fs)), m):
            term = eye
            for k in subset:
                term = Js[k] @ term
            terms[subset] = term

    def stack(v: torch.Tensor) -> torch.Tensor:
        for f in fs:
            v = v + f(v)
        return v

    return SubsetExpansion(product=product, terms=terms, autograd=jacobian(stack, x))
