"""Q-, K- and V-composition scores for every pair of heads, batched over the low-rank factors.

The theory's score (Definition 4) of an earlier head A and a later head B is

    ||W_OV^A M||_F / (||W_OV^A||_F ||M||_F),   W_OV = W_V W_O,

with ``M = W_K^B`` (K), ``W_Q^B`` (Q) or ``W_OV^B`` (V). ``full_circuit=True`` gives the
Elhage et al. / TransformerLens variant, ``M = W_QK^T`` for K and ``W_QK`` for Q, equal to
``HookedTransformer.all_composition_scores``.

Why it is fast: every matrix involved is a product of ``d_model x d_head`` factors, and
Frobenius norms are invariant under orthonormal factors. With ``W_V = Q R`` (QR),
``||W_V W_O M|| = ||R W_O M||``, and ``M``'s trailing factor reduces the same way, so each pair
needs one ``(d_head x d_model) @ (d_model x d_head)`` product. For each source layer we do all
of them as one matrix product against every later head at once: no loop over pairs and no
``d_model x d_model`` matrix per pair.

>>> from rs_interp.models import make_attn_only
>>> s = composition_scores(make_attn_only(2), "k")
>>> tuple(s.scores.shape), bool(s.scores[1, :, 0, :].isnan().all()), s.baseline
((2, 2, 2, 2), True, None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float
from transformer_lens import FactoredMatrix

from .._backend import Model, attn_weight
from .._keywords import renamed, renamed_attribute
from ..exact.certificate import require
from ..exact.needs import QK_SCORES, needs
from ..exact.readout import compute_dtype
from ..exact.validate import check_head

__all__ = ["CompositionScores", "composition_scores", "random_baseline", "virtual_weight", "score_from_virtual_weight"]

#: Which input of the later head: its query, key or value (lowercase, as everywhere in rs_interp).
Kind = Literal["q", "k", "v"]
KINDS = ("q", "k", "v")


def check_which(which: object) -> str:
    """``which`` if it is ``"q"``, ``"k"`` or ``"v"``; a ``ValueError`` otherwise (no other spelling)."""
    if not isinstance(which, str) or which not in KINDS:
        raise ValueError(f"which must be 'q', 'k' or 'v' (lowercase), got {which!r}")
    return which


@dataclass(frozen=True)
class CompositionScores:
    """Composition scores of every (earlier, later) head pair.

    Attributes:
        scores: (src_layer, src_head, dst_layer, dst_head); NaN where ``src_layer >= dst_layer``.
        which: ``"q"``, ``"k"`` or ``"v"``.
        full_circuit: whether ``M`` is the full QK circuit (TransformerLens's variant).
        baseline: the expected score of random Gaussian matrices of the same shapes (with
            ``baseline=True``), else None.

    >>> from rs_interp import composition_scores, load_toy_model
    >>> k = composition_scores(load_toy_model("induction-2l"), "k")
    >>> k.which, k.full_circuit, tuple(k.scores.shape), bool(k.scores[1].isnan().all())  # no layer after the last
    ('k', False, (2, 2, 2, 2), True)
    """

    scores: Float[torch.Tensor, "src_layer src_head dst_layer dst_head"]
    which: str
    full_circuit: bool
    baseline: float | None = None
    kind = renamed_attribute("kind", "which")


def _r_factor(w: torch.Tensor) -> torch.Tensor:
    """R of the reduced QR of ``w`` (..., d_model, d_head): ``||X w^T||_F = ||X R^T||_F``, ``||w Y|| = ||R Y||``."""
    return torch.linalg.qr(w, mode="r").R


def _left_factors(W_V: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """(layer, head, d_head, d_model) factors with ``||L Y||_F = ||W_V W_O Y||_F`` for any Y."""
    return _r_factor(W_V) @ W_O


def _right_factors(
    W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, which: Kind, full_circuit: bool
) -> torch.Tensor:
    """(layer, head, d_model, k) factors with ``||X F||_F = ||X M||_F`` for any X."""
    if which == "v":
        return W_V @ _r_factor(W_O.transpose(-1, -2)).transpose(-1, -2)
    if not full_circuit:
        return W_K if which == "k" else W_Q
    if which == "k":  # M = W_QK^T = W_K W_Q^T
        return W_K @ _r_factor(W_Q).transpose(-1, -2)
    return W_Q @ _r_factor(W_K).transpose(-1, -2)  # M = W_QK = W_Q W_K^T


@needs("heads", "values", optional=QK_SCORES, refuses=("post-norm blocks",))
@renamed(kind="which")
def composition_scores(
    model: Model,
    which: Kind,
    *,
    full_circuit: bool = False,
    baseline: bool = False,
    dtype: torch.dtype | None = None,
) -> CompositionScores:
    """Composition scores of every (earlier, later) head pair; NaN where ``src_layer >= dst_layer``.

    Args:
        model: any ``Model`` (toy models, GPT-2 small).
        which: which input of the later head, ``"q"``, ``"k"`` or ``"v"`` (TransformerLens's ``all_composition_scores`` spells them
            ``"Q"``, ``"K"``, ``"V"``; rs_interp accepts lowercase only).
        full_circuit: use ``M = W_QK^T`` (k) / ``W_QK`` (q) as TransformerLens does.
        baseline: also compute the expected score of random Gaussian matrices of the same shapes
            (close to ``1/sqrt(d_model)``), to read the scores against chance.
        dtype: compute dtype (default: the model's; float32 for float16/bfloat16 models).

    Returns:
        A :class:`CompositionScores` (``.scores`` the tensor; ``.baseline`` with ``baseline=True``).

    >>> from rs_interp import load_toy_model
    >>> k = composition_scores(load_toy_model(), "k", baseline=True)
    >>> bool((k.scores[0, :, 1, :] > 0).all()), 0.1 < k.baseline < 0.25  # 1/sqrt(32) = 0.18
    (True, True)
    """
    which = check_which(which)
    require(model, "composition_scores", also=() if which == "v" else ("scores",))
    L, H = model.cfg.n_layers, model.cfg.n_heads
    with torch.no_grad():
        dt = dtype or compute_dtype(model)  # float32 for half models: QR has no half-precision CPU kernel
        if dt in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be float32 or float64 (QR has no {dt} kernel), got {dt}")
        W_Q, W_K, W_V, W_O = (attn_weight(model, n, H).to(dt) for n in ("W_Q", "W_K", "W_V", "W_O"))
        left = _left_factors(W_V, W_O)  # (L, H, d_head, d_model)
        right = _right_factors(W_Q, W_K, W_V, W_O, which, full_circuit)  # (L, H, d_model, k)
        left_norm = left.flatten(-2).norm(dim=-1)  # (L, H)
        right_norm = right.flatten(-2).norm(dim=-1)
        scores = torch.full((L, H, L, H), float("nan"), dtype=dt, device=left.device)
        d_head, k = left.shape[-2], right.shape[-1]
        for src in range(L - 1):  # one product per source layer, against all later heads
            lhs = left[src].reshape(H * d_head, -1)  # (H*d_head, d_model)
            rhs = right[src + 1 :].permute(2, 0, 1, 3).reshape(lhs.shape[1], -1)  # (d_model, later*H*k)
            prod = (lhs @ rhs).reshape(H, d_head, L - src - 1, H, k)
            num = prod.pow(2).sum(dim=(1, 4)).sqrt()  # (H, later, H)
            scores[src, :, src + 1 :, :] = num / left_norm[src][:, None, None] / right_norm[src + 1 :][None]
    base = random_baseline(model, which, full_circuit=full_circuit) if baseline else None
    return CompositionScores(scores=scores, which=which, full_circuit=full_circuit, baseline=base)


@renamed(kind="which")
def random_baseline(
    model: Model, which: Kind, *, full_circuit: bool = False, n_samples: int = 200, seed: int = 0
) -> float:
    """Mean composition score of independent standard Gaussian factors of the model's shapes.

    Deterministic (seeded) Monte Carlo over ``n_samples`` pairs; for the theory's definition of K
    and Q it is close to ``sqrt(d_head / d_model) / sqrt(d_head) = 1/sqrt(d_model)``.
    """
    which = check_which(which)
    d_model, d_head = model.cfg.d_model, model.cfg.d_head
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    W_V, W_O = randn(n_samples, d_model, d_head), randn(n_samples, d_head, d_model)
    ov = W_V @ W_O
    if which == "v":
        m = randn(n_samples, d_model, d_head) @ randn(n_samples, d_head, d_model)
    elif full_circuit:
        m = randn(n_samples, d_model, d_head) @ randn(n_samples, d_head, d_model)
    else:
        m = randn(n_samples, d_model, d_head)
    fro = lambda x: x.flatten(-2).norm(dim=-1)  # noqa: E731
    return float((fro(ov @ m) / fro(ov) / fro(m)).mean())


def _circuit(model: Model, layer: int, head: int, which: Kind) -> torch.Tensor | FactoredMatrix:
    """The later head's matrix ``M`` of Definition 4: ``W_K`` (k), ``W_Q`` (q) or ``W_OV`` (v)."""
    if which == "k":
        return attn_weight(model, "W_K", model.cfg.n_heads)[layer, head]
    if which == "q":
        return model.W_Q[layer, head]
    return FactoredMatrix(attn_weight(model, "W_V", model.cfg.n_heads)[layer, head], model.W_O[layer, head])


@needs("heads", "values", optional=QK_SCORES, refuses=("post-norm blocks",))
@renamed(kind="which")
def virtual_weight(model: Model, src: tuple[int, int], dst: tuple[int, int], which: Kind) -> FactoredMatrix:
    """The virtual weight ``W_OV^src M^dst`` between two heads as a low-rank ``FactoredMatrix``.

    ``W_OV^src = W_V W_O`` has rank at most ``d_head`` (Definition 4), so the product does too: it
    is kept as ``W_V^src (W_O^src M)``, never as a ``d_model x d_model`` (or ``d_model x d_head``)
    product of full matrices. :func:`score_from_virtual_weight` reads the composition score from it.

    >>> from rs_interp import load_toy_model
    >>> vw = virtual_weight(load_toy_model(), (0, 0), (1, 1), "k")
    >>> tuple(vw.A.shape), tuple(vw.B.shape)
    ((32, 16), (16, 16))
    """
    (ls, hs), (ld, hd) = check_head(model, *src, name="src"), check_head(model, *dst, name="dst")
    if ls >= ld:
        raise ValueError(f"src layer {ls} must come before dst layer {ld}")
    which = check_which(which)
    require(model, "virtual_weight", also=() if which == "v" else ("scores",))
    with torch.no_grad():
        return FactoredMatrix(attn_weight(model, "W_V", model.cfg.n_heads)[ls, hs], model.W_O[ls, hs]) @ _circuit(model, ld, hd, which)


@renamed(kind="which")
def score_from_virtual_weight(model: Model, src: tuple[int, int], dst: tuple[int, int], which: Kind) -> float:
    """Definition 4's composition score, ``||W_OV^src M|| / (||W_OV^src|| ||M||)``, from the virtual weight."""
    which = check_which(which)
    with torch.no_grad():
        ov = FactoredMatrix(attn_weight(model, "W_V", model.cfg.n_heads)[src], model.W_O[src])
        m = _circuit(model, *dst, which)
        m_norm = m.norm() if isinstance(m, FactoredMatrix) else m.norm()
        return float(virtual_weight(model, src, dst, which).norm() / (ov.norm() * m_norm))
