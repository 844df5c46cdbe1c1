"""J-space: an activation as a sparse non-negative sum of Jacobian-lens vectors (Gurnee et al. 2026).

The J-lens vector of token ``t`` at layer ``l`` is ``v_t = J_l^T W_U[:, t]`` (:func:`rs_interp.lens_vectors`); the
vocabulary's vectors are the *dictionary* ``D`` (d_vocab, d_model), one atom a row. An activation ``x`` is
decomposed greedily (:func:`sparse_decomposition`): at each of at most ``k`` steps the atom most correlated with
the residual (atoms of unit norm, so none is preferred for its length) joins the selected set, and the selected
atoms' coefficients are updated under ``c >= 0``:

- ``"omp"`` (non-negative orthogonal matching pursuit, the default): re-solved jointly by non-negative least squares
  (Lawson and Hanson's active set, in float64), then checked against the KKT conditions, ``c >= 0``,
  ``D_S (x - D_S^T c) <= 0`` where ``c = 0`` and ``= 0`` where ``c > 0``; a failed check raises;
- ``"gradient_pursuit"`` (Blumensath and Davies 2008, the paper's update): one exact-step gradient step on the
  selected coefficients, projected onto ``c >= 0``.

Selection stops early once no unselected atom is positively correlated beyond float rounding (a non-negative
coefficient cannot use it). The *support* is the atoms whose contribution ``c_i ||v_i||`` is a material fraction
of ``||x||``; the *J-space component* is the orthogonal projection of ``x`` onto the span of every selected atom
(the paper's appendix), the rest its *non-J-space component*.

The algorithms, thresholds and results are TransformerLens 4.3's (``tools/analysis/jacobian_lens_decomposition.py``,
from the paper's Methods), so the two agree; in float64 where the activation is float64.

>>> D = torch.eye(4, dtype=torch.float64)
>>> dec = sparse_decomposition(torch.tensor([3.0, 0.0, 1.0, -2.0], dtype=torch.float64), D, k=3)
>>> dec.support.tolist(), dec.coordinates.tolist(), dec.top(1)
([0, 2], [3.0, 1.0], [(0, 3.0)])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model
from .._messages import few
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import needs
from ..exact.readout import compute_dtype
from ..exact.stream import record
from ..exact.validate import check_int_range, check_tokens
from .jacobian_basis import in_model_basis
from .jacobian_lens import JacobianLens

__all__ = ["ALGORITHMS", "DEFAULT_K", "JSpaceDecomposition", "sparse_decomposition", "jspace_decomposition",
           "dictionary", "activation_at"]

#: The coefficient updates: non-negative OMP (an exact re-solve) and gradient pursuit (the paper's).
ALGORITHMS = ("omp", "gradient_pursuit")
#: Atoms at most (the paper: "typically no more than 25").
DEFAULT_K = 25
#: The NNLS solve's relative tolerance (rank, zeroed coefficients, KKT) and the activity threshold: sqrt(eps64).
_NNLS_RTOL = math.sqrt(torch.finfo(torch.float64).eps)
_BACKTRACK = 20


@dataclass(frozen=True)
class JSpaceDecomposition:
    """An activation as a sparse non-negative combination of dictionary atoms (module docstring).

    Attributes:
        support: (n,) the active atoms (token ids for the vocabulary's dictionary), in the order selected.
        coordinates: (n,) their coefficients, all positive.
        selected_support: every atom selected (``support`` is a subset of it, at most ``k`` in all).
        reconstruction: (d_model,) ``coordinates @ D[support]``.
        j_space_component: (d_model,) the projection of the activation onto the span of ``selected_support``.
        non_j_space_component: (d_model,) the activation minus ``j_space_component``.
        algorithm: ``"omp"`` or ``"gradient_pursuit"``.
        kkt_gap: the largest violation of the NNLS conditions on the selected atoms, in units of their tolerance
            (``sqrt(eps64)`` of their scale): at most 1 for ``"omp"`` (checked; else ``RuntimeError``);
            ``"gradient_pursuit"`` need not satisfy them.

    >>> dec = sparse_decomposition(torch.tensor([1.0, 2.0]), torch.eye(2), k=2)
    >>> dec.top(2, decode=lambda t: f"tok{t}")
    [('tok1', 2.0), ('tok0', 1.0)]
    """

    support: Int[torch.Tensor, " n"]
    coordinates: Float[torch.Tensor, " n"]
    selected_support: Int[torch.Tensor, " m"]
    reconstruction: Float[torch.Tensor, " d_model"]
    j_space_component: Float[torch.Tensor, " d_model"]
    non_j_space_component: Float[torch.Tensor, " d_model"]
    algorithm: str = "omp"
    kkt_gap: float = 0.0

    def top(self, k: int = 5, decode: Callable[[int], Any] | None = None) -> list[tuple[Any, float]]:
        """The ``k`` largest coordinates, ``(atom, coordinate)``, each atom through ``decode`` where given
        (e.g. ``model.to_single_str_token``)."""
        k = check_int_range("k", k, 1)
        order = self.coordinates.argsort(descending=True)[:k]
        return [((decode or int)(int(self.support[i])), round(float(self.coordinates[i]), 4)) for i in order]


def check_inputs(x: torch.Tensor, D: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` and ``D`` in the working dtype (float64 where ``x`` is, else float32), checked."""
    if D.ndim != 2:
        raise ValueError(f"the dictionary must be (atoms, d_model), got shape {tuple(D.shape)}")
    if x.ndim != 1 or x.shape[0] != D.shape[1]:
        raise ValueError(f"the activation must be 1-D of length d_model={D.shape[1]}, got shape {tuple(x.shape)}")
    if torch.is_complex(x) or torch.is_complex(D):
        raise ValueError("the activation and the dictionary must be real")
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    x, D = x.detach().to(dt), D.detach().to(dt)
    if not torch.isfinite(x).all() or not torch.isfinite(D).all():
        raise ValueError("the activation or the dictionary holds non-finite entries")
    if bool((D.norm(dim=1) == 0).any()):
        raise ValueError("the dictionary holds an atom of norm zero")
    return x, D


def kkt_violation(A: torch.Tensor, x: torch.Tensor, c: torch.Tensor, rtol: float) -> tuple[float, str]:
    """The largest violation of the NNLS conditions of ``min ||A c - x||, c >= 0`` (columns of ``A`` the atoms)
    relative to its tolerance, and which: primal ``c >= 0``, dual ``w = A^T (x - A c) <= 0`` where ``c = 0``,
    stationarity ``w = 0`` where ``c > 0``, complementarity ``c w = 0``."""
    if c.numel() == 0:
        return 0.0, ""
    tiny = torch.finfo(x.dtype).tiny
    norms = A.norm(dim=0).clamp_min(tiny)
    scale = (x.norm() + (A.abs() @ c.abs()).norm()).clamp_min(tiny)
    dual_tol, coef_tol = rtol * norms * scale, rtol * scale / norms
    w = A.T @ (x - A @ c)
    pos = c > coef_tol
    checks = [((-c / coef_tol).max(), "primal feasibility (c >= 0)"),
              (((w / dual_tol)[~pos]).max() if (~pos).any() else w.new_zeros(()), "dual feasibility where c = 0"),
              (((w.abs() / dual_tol)[pos]).max() if pos.any() else w.new_zeros(()), "stationarity where c > 0"),
              (((c.abs() * w.abs()) / ((c.abs() + coef_tol) * dual_tol)).max(), "complementarity (c w = 0)")]
    worst = max(checks, key=lambda v: float(v[0]))
    return float(worst[0]), worst[1]


def _nnls(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``argmin ||A c - x||`` over ``c >= 0`` by Lawson and Hanson's active set in float64 (a zeroed atom joins the
    free set when most positively correlated with the residual; a free one leaves when its trial coefficient turns
    negative), checked against the KKT conditions (a failure raises ``RuntimeError``); in ``x``'s dtype."""
    n = A.shape[1]
    if n == 0:
        return x.new_zeros(0)
    A64, x64 = A.to(torch.float64), x.to(torch.float64)
    c = x64.new_zeros(n)
    free = torch.zeros(n, dtype=torch.bool)
    budget, corrections, admissions = 3 * n, 0, 0
    while not bool(free.all()):
        tiny = torch.finfo(torch.float64).tiny
        norms = A64.norm(dim=0).clamp_min(tiny)
        scale = (x64.norm() + (A64.abs() @ c.abs()).norm()).clamp_min(tiny)
        w = (A64.T @ (x64 - A64 @ c)).masked_fill(free, float("-inf"))
        if bool((w <= _NNLS_RTOL * norms * scale).all()):
            break
        admissions += 1
        if admissions > n * (budget + 1):
            raise RuntimeError("NNLS: the active set cycles")
        free[int(w.argmax())] = True
        while True:  # the unconstrained fit on the free set; step back while a free coefficient turns negative
            cols = free.nonzero()[:, 0]
            trial = x64.new_zeros(n)
            trial[cols] = torch.linalg.pinv(A64[:, cols], rtol=_NNLS_RTOL) @ x64
            coef_tol = _NNLS_RTOL * scale / norms
            negative = free & (trial < -coef_tol)
            if not bool(negative.any()):
                free = trial > coef_tol
                c = torch.where(free, trial, torch.zeros_like(trial))
                break
            corrections += 1
            if corrections > budget:
                raise RuntimeError("NNLS: the feasibility corrections exceeded their budget")
            gap = c - trial
            ratios = torch.where(negative & (gap > 0), c / gap, torch.full_like(c, float("inf")))
            step = float(ratios.min())
            if not math.isfinite(step) or not -_NNLS_RTOL <= step <= 1 + _NNLS_RTOL:
                raise RuntimeError(f"NNLS: a line-search step {step} outside [0, 1]")
            before = int(free.sum())
            moved = c + min(max(step, 0.0), 1.0) * (trial - c)
            free = moved > coef_tol
            c = torch.where(free, moved, torch.zeros_like(moved))
            if int(free.sum()) >= before:
                raise RuntimeError("NNLS: a feasibility correction made no progress")
    gap, which = kkt_violation(A64, x64, c, _NNLS_RTOL)
    if gap > 1:
        raise RuntimeError(f"NNLS: the solution violates {which} ({gap:.3g} times its tolerance)")
    return c.to(x.dtype)


def gradient_step(A: torch.Tensor, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """One exact-step gradient step on ``||A c - x||^2`` from ``c``, projected onto ``c >= 0``; halved while the
    projection raises the residual (at most :data:`_BACKTRACK` times, else ``c`` kept)."""
    r = x - A @ c
    direction = A.T @ r
    moved = A @ direction
    denom = float(moved @ moved)
    feasible = c.clamp_min(0.0)
    if denom <= 0.0:
        return feasible
    step, current = float(moved @ r) / denom, float(r @ r)
    for _ in range(_BACKTRACK + 1):
        trial = (c + step * direction).clamp_min(0.0)
        rt = x - A @ trial
        if float(rt @ rt) <= current:
            return trial
        step *= 0.5
    return feasible


def project(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The orthogonal projection of ``x`` onto the span of ``A``'s columns, in float64 (unit columns, singular
    values below ``sqrt(eps64)`` of the largest dropped)."""
    if A.shape[1] == 0:
        return torch.zeros_like(x)
    U = A.to(torch.float64) / A.to(torch.float64).norm(dim=0).clamp_min(torch.finfo(torch.float64).tiny)
    left, sv, _ = torch.linalg.svd(U, full_matrices=False)
    basis = left[:, sv > _NNLS_RTOL * sv.max()]
    return (basis @ (basis.T @ x.to(torch.float64))).to(x.dtype)


def _active(c: torch.Tensor, A: torch.Tensor, x_norm: float) -> torch.Tensor:
    """The selected atoms whose contribution ``c_i ||v_i||`` is a material fraction (``sqrt(eps64)``) of ``||x||``."""
    return c * A.norm(dim=0) > _NNLS_RTOL * x_norm


def select_atom(D: torch.Tensor, norms: torch.Tensor, residual: torch.Tensor, chosen: list[int]) -> tuple[int, float]:
    """The unselected atom most correlated with the residual (atoms of unit norm) and its correlation."""
    corr = (D @ residual) / norms
    if chosen:
        corr[chosen] = float("-inf")
    i = int(corr.argmax())
    return i, float(corr[i])


def sparse_decomposition(x: Float[torch.Tensor, " d_model"], dictionary: Float[torch.Tensor, "atoms d_model"],
                         k: int = DEFAULT_K, *, algorithm: str = "omp") -> JSpaceDecomposition:
    """``x`` as at most ``k`` non-negative dictionary atoms (module docstring): the model-free step of
    :func:`rs_interp.jspace_decomposition`.

    Raises:
        ValueError: an unknown algorithm, shapes that do not match, ``k`` outside ``[1, atoms]``, non-finite
            entries or an atom of norm zero.
        RuntimeError: ``"omp"``'s solve cannot be certified against the KKT conditions.

    >>> D = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    >>> dec = sparse_decomposition(torch.tensor([2.0, 1.0]), D, k=2)
    >>> torch.allclose(dec.reconstruction, dec.coordinates @ D[dec.support]), dec.kkt_gap <= 1
    (True, True)
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    x, D = check_inputs(x, dictionary)
    k = check_int_range("k", k, 1, D.shape[0])
    norms = D.norm(dim=1)
    x_norm = float(x.norm())
    stop = math.sqrt(torch.finfo(x.dtype).eps) * x_norm  # the residual's rounding floor: no material correlation
    chosen: list[int] = []
    c = x.new_zeros(0)
    residual = x.clone()
    for _ in range(k):
        i, corr = select_atom(D, norms, residual, chosen)
        if corr <= stop:
            break
        chosen.append(i)
        A = D[chosen].T
        c = _nnls(A, x) if algorithm == "omp" else gradient_step(A, x, torch.cat([c, c.new_zeros(1)]))
        residual = x - A @ c
    selected = torch.tensor(chosen, dtype=torch.long)
    A = D[selected].T
    active = _active(c, A, x_norm)
    coords, atoms = c[active], A[:, active]
    j_space = project(A, x)
    gap = kkt_violation(A.to(torch.float64), x.to(torch.float64), c.to(torch.float64), _NNLS_RTOL)[0]
    return JSpaceDecomposition(support=selected[active.cpu()], coordinates=coords, selected_support=selected,
                               reconstruction=atoms @ coords, j_space_component=j_space,
                               non_j_space_component=x - j_space, algorithm=algorithm, kkt_gap=gap)


# --- on a model -----------------------------------------------------------------------------------------------

def dictionary(model: Model, lens: JacobianLens, layer: int, helper: str = "jspace") -> torch.Tensor:
    """(d_vocab, d_model) every token's J-lens vector at ``layer``, ``W_U^T J_layer``, in the model's basis and
    compute dtype."""
    J = in_model_basis(lens, model, helper)[layer_index(lens, layer, helper)]
    return (J.T @ model.W_U.detach().to(J.dtype)).T


def layer_index(lens: JacobianLens, layer: int, helper: str) -> int:
    if layer not in lens.source_layers:
        raise ValueError(f"{helper}: layer {layer} is not one of the lens's source layers {few(lens.source_layers)}.")
    return lens.source_layers.index(layer)


def activation_at(model: Model, activation: torch.Tensor, layer: int, position: int | None,
                  helper: str) -> torch.Tensor:
    """The activation a J-space helper reads: a (d_model,) vector as given (``position`` None), or the stream after
    block ``layer`` at ``position`` of a prompt ((pos,) or (1, pos) tokens)."""
    if position is None:
        if activation.ndim != 1 or activation.shape[0] != model.cfg.d_model or not activation.dtype.is_floating_point:
            raise ValueError(f"{helper}: without a position, the activation must be a (d_model,) = "
                             f"({model.cfg.d_model},) float vector, got {tuple(activation.shape)} {activation.dtype}; "
                             "pass tokens with a position")
        return activation.to(compute_dtype(model))
    tokens = check_tokens(model, activation)
    if tokens.shape[0] != 1:
        raise ValueError(f"{helper} reads one prompt, got a batch of {tokens.shape[0]}")
    p = check_int_range("position", position, -tokens.shape[1], tokens.shape[1] - 1) % tokens.shape[1]
    with preserve_state(model):
        box = record(model, tokens, lambda name: name == N.resid_post(layer))
    return box[N.resid_post(layer)][0, p].to(compute_dtype(model))


@needs("readout", "vocabulary")
def jspace_decomposition(
    model: Model,
    lens: JacobianLens,
    activation: torch.Tensor,
    layer: int,
    *,
    position: int | None = None,
    k: int = DEFAULT_K,
    algorithm: str = "omp",
) -> JSpaceDecomposition:
    """The J-space decomposition of an activation at ``layer`` over the vocabulary's J-lens vectors: its support is
    token ids (module docstring).

    Args:
        model: any ``Model``.
        lens: a :class:`rs_interp.JacobianLens` of this model.
        activation: a (d_model,) vector, or a prompt's tokens with ``position`` (its stream after block ``layer``).
        layer: one of the lens's source layers.
        position: the position read in a prompt (negative counts from the end).
        k: atoms at most.
        algorithm: ``"omp"`` (the default) or ``"gradient_pursuit"``.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(2, seed=0).tokens
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> dec = ri.jspace_decomposition(model, lens, toks[0], 0, position=-1, k=5)
    >>> len(dec.support) <= 5, dec.kkt_gap <= 1
    (True, True)
    """
    require(model, "jspace_decomposition")
    x = activation_at(model, activation, layer, position, "jspace_decomposition")
    return sparse_decomposition(x, dictionary(model, lens, layer, "jspace_decomposition"), k, algorithm=algorithm)
