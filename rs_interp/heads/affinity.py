"""Head subspace affinities: how much of an earlier head's write subspace a later head's query, key or value
reads, basis-invariantly, for every (earlier, later) head pair.

Head ``A`` writes into the span of its ``W_O^T`` (``d_model x d_head``); head ``B`` reads its query from the span
of ``W_Q^B``, its key from ``W_K^B`` and its value from ``W_V^B``. Their affinity is the projection kernel of the
two subspaces (:mod:`rs_interp.variables.kernel`), with orthonormal bases ``U`` of ``W_O^A``'s row space and
``V`` of ``W_M^B``'s column space:

    OQ / OK / OV(A, B) = ||U^T V||_F^2,   normalized = ||U^T V||_F^2 / sqrt(r_A r_B),

in ``[0, min(r_A, r_B)]``: the sum of the squared cosines of the principal angles. Unlike the composition
scores (:mod:`.composition`) it depends on the subspaces only, not on the weights' scale or on which
directions inside them are large; between independent random subspaces of rank ``r`` its mean is
``r^2 / d_model`` (:attr:`HeadAffinity.reference`). These are TransformerLens 4.3's
``attention_head_subspace_affinity`` (its ``source_role="O"``, ``layer_order="forward"``), equal to float64
rounding; under grouped-query attention the key and value heads stay native (one per KV head), as there.

Why it is fast: one batched QR gives every head's basis; then every pair's kernel is the Frobenius inner
product of the two projections, ``<U U^T, V V^T>``, so for each source layer one product of the flattened
projections scores it against every later head: about ``d_model^2 / 2`` multiply-adds per pair (the
projections are symmetric: their upper triangles, packed) instead of ``d_head^2 d_model``, and only the
earlier/later pairs; :func:`head_affinities` builds the earlier heads' projections once for the three
inputs. Past ``memory_budget``, the factor products ``U^T V``, as TransformerLens does.

>>> import rs_interp as ri
>>> a = head_affinity(ri.load_toy_model("induction-2l"), "k")
>>> tuple(a.scores.shape), a.rank, bool(a.scores[1].isnan().all()), round(a.reference.mean, 3)
((2, 2, 2, 2), 16, True, 8.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from .._backend import Model, attn_weight, kv_groups
from .._budget import MEMORY_BUDGET
from ..exact.certificate import require
from ..exact.needs import QK_SCORES, needs
from ..exact.readout import compute_dtype
from ..exact.validate import as_int
from ..labels import head_labels, kv_label
from ..metrics import top_effects
from ..variables.kernel import KernelMoments, clamp_kernel, random_kernel_moments
from .composition import check_which

__all__ = ["HeadAffinity", "head_affinity", "head_affinities"]


@dataclass(frozen=True)
class HeadAffinity:
    """OQ, OK or OV projection-kernel affinities of every (earlier head, later head) pair (module docstring).

    Attributes:
        scores: (src_layer, src_head, dst_layer, dst_head) the kernel ``||U^T V||_F^2``; NaN where the later
            head is not in a later layer. ``dst_head`` counts key/value heads for ``"k"`` and ``"v"`` under
            grouped-query attention.
        normalized: ``scores / sqrt(r_src r_dst)``.
        which: ``"q"``, ``"k"`` or ``"v"``: the later head's input.
        rank: the rank of every subspace compared (``d_head``, or the ``rank=`` asked).
        reference: the kernel's moments between independent random rank-``rank`` subspaces of ``d_model``.
        source_ranks, target_ranks: each head's measured numerical rank (before any truncation).
        labels: each (source, target) pair's ``(label, label)``, row-major like ``scores``.

    >>> import rs_interp as ri
    >>> a = ri.head_affinity(ri.load_toy_model("induction-2l"), "v")
    >>> a.labels[2], round(float(a.normalized[0, 0, 1, 0]), 4) == round(float(a.scores[0, 0, 1, 0]) / 16, 4)
    (('L0H0', 'L1H0'), True)
    """

    scores: Float[torch.Tensor, "src_layer src_head dst_layer dst_head"]
    normalized: Float[torch.Tensor, "src_layer src_head dst_layer dst_head"]
    which: str
    rank: int
    reference: KernelMoments
    source_ranks: Int[torch.Tensor, "layer head"]
    target_ranks: Int[torch.Tensor, "layer dst_head"]
    labels: tuple[tuple[str, str], ...]

    def top(self, k: int = 5) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` pairs of largest normalized affinity, with it (NaN pairs never picked).

        >>> import rs_interp as ri
        >>> head_affinity(ri.load_toy_model("induction-2l"), "v").top(1)[0][0][0].startswith("L0")
        True
        """
        return top_effects(self.labels, self.normalized, k)


def _bases(matrices: torch.Tensor, rank: int | None, rtol: float, role: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer, head, d_model, r) orthonormal bases of ``matrices``' column spans, batched, and each head's measured
    rank (the singular values above ``rtol`` times the largest); a head of lower rank than asked (``d_head`` by
    default) is refused by name. The whole span: one batched QR (any orthonormal basis gives the same kernel),
    its ranks from R's singular values; a truncation to ``rank``: the leading left singular vectors."""
    L, H, d, w = matrices.shape
    flat = matrices.reshape(L * H, d, w)
    if rank is None or rank == w:
        basis, upper = torch.linalg.qr(flat)
        sv = torch.linalg.svdvals(upper)
    else:
        basis, sv, _ = torch.linalg.svd(flat, full_matrices=False)
    measured = (sv > sv[:, :1] * rtol).sum(-1).reshape(L, H)
    want = w if rank is None else rank
    low = (measured < want).nonzero()
    if len(low):
        l, h = (int(x) for x in low[0])
        raise ValueError(f"head affinity needs subspaces of rank {want}: {role} of layer {l}, head {h} has numerical "
                         f"rank {int(measured[l, h])} (threshold {rtol:.2g} of its largest singular value); "
                         "pass rank= at most the smallest head's rank")
    return basis[:, :, :want].reshape(L, H, d, want), measured


def _targets(model: Model, which: str, H: int) -> tuple[torch.Tensor, list[str]]:
    """The later heads' input matrices (layer, head, d_model, d_head), key/value heads native, and their labels."""
    name = {"q": "W_Q", "k": "W_K", "v": "W_V"}[which]
    w = attn_weight(model, name, H)
    if which == "q":
        return w, list(head_labels(model.cfg.n_layers, H))
    groups = kv_groups(model.cfg)
    native = w[:, :: H // groups]  # per_query_head repeats KV head g for query heads g*(H/G) ... (g+1)*(H/G)-1
    labels = [kv_label(l, g) if groups != H else f"L{l}H{g}" for l in range(model.cfg.n_layers) for g in range(groups)]
    return native, labels


#: Row strips a projection is packed in (module docstring): its upper triangle in 8 strips, 56% of ``d^2``.
STRIPS = 8


def _projections(bases: torch.Tensor, off_diagonal: float) -> torch.Tensor:
    """(layer, head, packed) each head's orthogonal projection ``U U^T``, packed: a symmetric matrix's inner
    product with another is its upper triangle's, the off-diagonal entries counted twice. The rows are cut
    in :data:`STRIPS` strips and strip ``a`` keeps its columns from its own diagonal block on, the entries
    right of that block times ``off_diagonal`` (2 on one side of the product, 1 on the other: exact)."""
    L, H, d, _ = bases.shape
    cuts = list(range(0, d, -(-d // STRIPS))) + [d]
    sizes = [(b - a) * (d - a) for a, b in zip(cuts, cuts[1:])]
    out = torch.empty(L, H, sum(sizes), dtype=bases.dtype, device=bases.device)
    for l in range(L):
        at = 0
        for (a, b), size in zip(zip(cuts, cuts[1:]), sizes):
            strip = out[l, :, at:at + size].view(H, b - a, d - a)
            torch.matmul(bases[l, :, a:b], bases[l, :, a:].transpose(-1, -2), out=strip)
            strip[:, :, b - a:] *= off_diagonal
            at += size
    return out


def _by_projections(p_src: torch.Tensor, p_dst: torch.Tensor) -> torch.Tensor:
    """(L, H, L, Ht) kernels of every (earlier, later) pair as inner products of projections; NaN elsewhere."""
    L, H, dd = p_src.shape
    Ht = p_dst.shape[1]
    out = torch.full((L, H, L, Ht), float("nan"), dtype=p_src.dtype, device=p_src.device)
    for l in range(L - 1):
        out[l, :, l + 1:] = (p_src[l] @ p_dst[l + 1:].reshape(-1, dd).T).reshape(H, L - l - 1, Ht)
    return out


def _by_factors(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """The same kernels from the factors, ``||U^T V||_F^2`` (TransformerLens's way), for models whose
    projections do not fit the memory budget."""
    L, H, d, r = src.shape
    Ht = dst.shape[1]
    out = torch.full((L, H, L, Ht), float("nan"), dtype=src.dtype, device=src.device)
    for l in range(L - 1):
        prod = src[l].transpose(-1, -2).reshape(H * r, d) @ dst[l + 1:].permute(2, 0, 1, 3).reshape(d, -1)
        out[l, :, l + 1:] = prod.square_().view(H, r, -1, r).sum(-1).sum(1).view(H, L - l - 1, Ht)
    return out


@needs("heads", "values", optional=QK_SCORES, refuses=("post-norm blocks",))
def head_affinity(model: Model, which: str, *, rank: int | None = None, rtol: float | None = None,
                  memory_budget: int = MEMORY_BUDGET) -> HeadAffinity:
    """OQ, OK or OV projection-kernel affinities of every (earlier, later) head pair (module docstring).

    Args:
        model: any ``Model`` (post-norm blocks refused, as for the composition scores).
        which: the later head's input, ``"q"``, ``"k"`` or ``"v"`` (TransformerLens's ``target_role``).
        rank: compare the leading ``rank`` directions of every head (each must have at least that numerical
            rank); default: every head's full ``d_head``, which each must have.
        rtol: the numerical-rank threshold relative to a head's largest singular value; default
            ``max(d_model, d_head)`` times the compute dtype's eps (TransformerLens's).
        memory_budget: bytes the projections may take at once (it only chooses how the products are taken).

    Returns:
        A :class:`HeadAffinity`, in float64 for a float64 model, else float32.

    Raises:
        ValueError: ``which`` not ``"q"``, ``"k"`` or ``"v"``; a head of lower rank than compared; a model whose
            certificate fails ``heads``, ``values`` (or ``scores`` for ``"q"``/``"k"``), or with post-norm blocks.

    >>> import rs_interp as ri
    >>> ok = head_affinity(ri.load_toy_model("induction-2l"), "k")
    >>> bool(ok.normalized[0, 0, 1].min() > ok.reference.mean / ok.rank)   # the previous-token head's keys
    True
    """
    which = check_which(which)
    require(model, "head_affinity", also=() if which == "v" else ("scores",))
    return head_affinities(model, which=(which,), rank=rank, rtol=rtol, memory_budget=memory_budget)[which]


@needs("heads", "values", optional={"scores": "which with 'q' or 'k'"}, refuses=("post-norm blocks",))
def head_affinities(model: Model, *, which: tuple[str, ...] | None = None, rank: int | None = None,
                    rtol: float | None = None, memory_budget: int = MEMORY_BUDGET) -> dict[str, HeadAffinity]:
    """:func:`head_affinity` for each input in ``which`` (None: ``("q", "k", "v")``), by name; the earlier heads'
    write subspaces and their projections are computed once for all.

    >>> import rs_interp as ri
    >>> sorted(head_affinities(ri.load_toy_model("induction-2l")))
    ['k', 'q', 'v']
    """
    kinds = tuple(dict.fromkeys(check_which(w) for w in (("q", "k", "v") if which is None else which)))
    if not kinds:
        raise ValueError("which is empty: name at least one of 'q', 'k', 'v'")
    require(model, "head_affinities", also=() if kinds == ("v",) else ("scores",))
    cfg = model.cfg
    dt = torch.float64 if compute_dtype(model) == torch.float64 else torch.float32
    budget = as_int("memory_budget", memory_budget)
    with torch.no_grad():
        src_w = attn_weight(model, "W_O", cfg.n_heads).transpose(-1, -2).to(dt)
        targets = {w: _targets(model, w, cfg.n_heads) for w in kinds}
        widest = max([src_w.shape[-1]] + [t.shape[-1] for t, _ in targets.values()])
        tol = max(cfg.d_model, widest) * torch.finfo(dt).eps if rtol is None else float(rtol)
        smallest = min([src_w.shape[-1]] + [t.shape[-1] for t, _ in targets.values()])
        if rank is not None and not 1 <= as_int("rank", rank) <= min(cfg.d_model, smallest):
            raise ValueError(f"rank must be in [1, {min(cfg.d_model, smallest)}], got {rank}")
        src, src_ranks = _bases(src_w, rank, tol, "W_O")
        heads = src.shape[0] * (src.shape[1] + max(t.shape[1] for t, _ in targets.values()))  # one kind's at a time
        p_src = _projections(src, 2.0) if heads * cfg.d_model**2 * src.element_size() <= budget else None
        return {w: _affinity(model, w, src, src_ranks, p_src, targets[w], rank, tol) for w in kinds}


def _affinity(model: Model, which: str, src: torch.Tensor, src_ranks: torch.Tensor, p_src: torch.Tensor | None,
              target: tuple[torch.Tensor, list[str]], rank: int | None, tol: float) -> HeadAffinity:
    dst_w, dst_labels = target
    dst, dst_ranks = _bases(dst_w.to(src.dtype), rank, tol, {"q": "W_Q", "k": "W_K", "v": "W_V"}[which])
    scores = _by_factors(src, dst) if p_src is None else _by_projections(p_src, _projections(dst, 1.0))
    r = src.shape[-1]
    valid = ~scores.isnan()
    if bool(valid.any()):
        scores[valid] = clamp_kernel(scores[valid], r)
    labels = tuple((s, t) for s in head_labels(model.cfg.n_layers, model.cfg.n_heads) for t in dst_labels)
    return HeadAffinity(scores=scores, normalized=scores / r, which=which, rank=r,
                        reference=random_kernel_moments(model.cfg.d_model, r), source_ranks=src_ranks,
                        target_ranks=dst_ranks, labels=labels)
