"""Anchored coordinate patching in J-space: edit one token's coordinate of an activation's sparse decomposition and
keep everything else (TransformerLens 4.3's ``jacobian_lens_coordinate_patch``, from the paper's Methods).

With the decomposition ``x = sum_i c_i v_i + r`` over its support (:func:`rs_interp.jspace_decomposition`; ``r`` the
anchored residual ``x - reconstruction``), the frame is the support with the target appended at 0 if absent:

- ``mode="substitute"``: the source's coordinate moves to the target, the source's becomes 0 (an active target's old
  coordinate is overwritten);
- ``mode="swap"``: the two coordinates are exchanged;

blended by ``alpha`` (``c' = c + alpha (edit - c)``; 0 changes nothing), and ``patched = x + sum_i (c'_i - c_i) v_i``:
every other coordinate and the residual ``r`` are kept exactly (measured and enforced: ``nonedited_max_delta`` and
``residual_max_delta``).

>>> D = torch.eye(3, dtype=torch.float64)
>>> patch = solve_coordinate_patch(torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64), D, 0, 1, k=3, mode="swap")
>>> patch.patched.tolist(), patch.support_after.tolist()
([0.0, 2.0, 1.0], [0, 2, 1])
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, MutableMapping, Sequence

import torch

from .. import _names as N
from .._backend import Model
from ..exact.certificate import require
from ..exact.needs import needs
from ..exact.readout import compute_dtype
from ..exact.validate import check_int_range
from .jacobian_lens import JacobianLens
from .jspace import (
    DEFAULT_K,
    JSpaceDecomposition,
    activation_at,
    check_inputs,
    dictionary,
    gradient_step,
    kkt_violation,
    project,
    sparse_decomposition,
)
from .lens_interventions import WARN_COSINE, position_hook, token_ids

__all__ = ["CoordinatePatch", "solve_coordinate_patch", "coordinate_patch", "coordinate_patch_hooks", "MODES"]

MODES = ("substitute", "swap")
#: A column-normalised edit basis past this condition number warns (1 / sqrt(eps32)).
_CONDITION_WARNING = 1.0 / math.sqrt(torch.finfo(torch.float32).eps)


@dataclass(frozen=True)
class CoordinatePatch:
    """One anchored edit of sparse J-space coordinates (module docstring).

    Attributes:
        support_before: the decomposition's active support.
        support_after: the frame edited: ``support_before``, the target appended if it was absent.
        coordinates_before, coordinates_after: the coordinates in that frame, before and after the edit.
        source_slot, target_slot: where the source and the target sit in the frame.
        target_was_appended: the target was not in the active support (appended at 0).
        target_was_selected: the target was among the atoms the pursuit selected (active or not).
        reconstruction_before: the decomposition's reconstruction; ``reconstruction_after`` adds ``delta``.
        residual: ``x - reconstruction_before``, kept by the edit.
        delta: ``basis @ (coordinates_after - coordinates_before)``; ``patched = x + delta``.
        nonedited_max_delta: the largest change of any coordinate but the two (0, enforced).
        residual_max_delta: how far ``patched - basis @ coordinates_after`` is from ``residual`` (enforced small).
        source_target_cosine: the cosine of the two atoms (|cos| >= 0.99 warns).
        basis_rank, basis_condition: the column-normalised frame's rank and condition number.

    >>> patch = solve_coordinate_patch(torch.tensor([2.0, 1.0]), torch.eye(2), 0, 1, k=2)  # substitute
    >>> patch.coordinates_before.tolist(), patch.coordinates_after.tolist(), patch.patched.tolist()
    ([2.0, 1.0], [0.0, 2.0], [0.0, 2.0])
    """

    support_before: torch.Tensor
    support_after: torch.Tensor
    coordinates_before: torch.Tensor
    coordinates_after: torch.Tensor
    source_slot: int
    target_slot: int
    target_was_appended: bool
    target_was_selected: bool
    reconstruction_before: torch.Tensor
    reconstruction_after: torch.Tensor
    residual: torch.Tensor
    delta: torch.Tensor
    patched: torch.Tensor
    nonedited_max_delta: float
    residual_max_delta: float
    source_target_cosine: float
    basis_rank: int
    basis_condition: float


def _close(a: torch.Tensor, b: torch.Tensor, condition: float = 1.0) -> bool:
    """Equal to 32 float32 epsilons of the larger, times the span's condition number (a pinv recompute's error)."""
    if a.shape != b.shape:
        return False
    tol = 32 * torch.finfo(torch.float32).eps * max(condition, 1.0)
    size = float(torch.stack([a.abs().max(), b.abs().max()]).max()) if a.numel() else 0.0
    return bool(torch.allclose(a, b, rtol=tol, atol=tol * size))


def _condition(A: torch.Tensor) -> float:
    sv = torch.linalg.svdvals(A)
    return math.inf if float(sv.min()) <= 0 else float(sv.max() / sv.min())


def _replays(dec: JSpaceDecomposition, x: torch.Tensor, D: torch.Tensor) -> bool:
    """Whether gradient pursuit over ``selected_support`` in order gives the decomposition's coordinates."""
    c = x.new_zeros(0)
    A = D[dec.selected_support].T
    for n in range(1, dec.selected_support.numel() + 1):
        c = gradient_step(A[:, :n], x, torch.cat([c, c.new_zeros(1)]))
    active = c * A.norm(dim=0) > math.sqrt(torch.finfo(torch.float64).eps) * float(x.norm())
    same = torch.equal(dec.support, dec.selected_support[active.cpu()])
    return same and _close(dec.coordinates.to(c.dtype), c[active])


def _check_decomposition(dec: JSpaceDecomposition, x: torch.Tensor, D: torch.Tensor) -> None:
    """A decomposition given by the caller must be one of ``x`` over ``D`` (its support in range and within the
    selected atoms, positive coordinates, its reconstruction and components what they say, its coordinates an NNLS
    fit or a gradient-pursuit replay).

    Raises:
        ValueError: naming what does not fit.
    """
    if not isinstance(dec, JSpaceDecomposition):
        raise ValueError(f"decomposition must be a JSpaceDecomposition, got {type(dec).__name__}")
    support, selected = dec.support.cpu(), dec.selected_support.cpu()
    for ids in (support, selected):
        if ids.ndim != 1 or ids.dtype != torch.long or ids.unique().numel() != ids.numel():
            raise ValueError("a decomposition's supports must be 1-D distinct torch.long ids")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= D.shape[0]):
            raise ValueError("the decomposition's support lies outside the dictionary")
    if not set(support.tolist()) <= set(selected.tolist()):
        raise ValueError("the decomposition's active support is not within its selected atoms")
    c = dec.coordinates.to(x.dtype)
    if c.shape != support.shape or not torch.isfinite(c).all() or bool((c <= 0).any()):
        raise ValueError("the decomposition's coordinates must be positive, one per active atom")
    A = D[selected].T
    cond = _condition(A / A.norm(dim=0)) if selected.numel() else 1.0
    if not _close(dec.reconstruction.to(x.dtype), D[support].T @ c, cond):
        raise ValueError("the decomposition's reconstruction is not its coordinates times its atoms of this dictionary")
    if not _close((dec.j_space_component + dec.non_j_space_component).to(x.dtype), x, cond):
        raise ValueError("the decomposition is of another activation")
    if not _close(dec.j_space_component.to(x.dtype), project(A, x), cond):
        raise ValueError("the decomposition's J-space component is not the projection onto its selected atoms")
    fits = (kkt_violation(D[support].T.double(), x.double(), c.double(), math.sqrt(torch.finfo(x.dtype).eps))[0] <= 1
            or _replays(dec, x, D))
    if not fits:
        raise ValueError("the decomposition's coordinates are neither an NNLS fit of the activation nor a "
                         "gradient-pursuit replay of its selected atoms")


def _edit(c: torch.Tensor, s: int, t: int, mode: str, alpha: float) -> torch.Tensor:
    edit = c.clone()
    edit[s], edit[t] = (c[t], c[s]) if mode == "swap" else (c.new_zeros(()), c[s])
    return c + alpha * (edit - c)


def _witnesses(before: torch.Tensor, after: torch.Tensor, s: int, t: int, patched: torch.Tensor, basis: torch.Tensor,
               residual: torch.Tensor) -> tuple[float, float]:
    """The largest change of a coordinate not edited, and of the residual recomputed from the dictionary's rows
    (``patched - basis @ after``), both in float64; each must stay within 256 float32 epsilons of the scale."""
    keep = torch.ones(before.numel(), dtype=torch.bool)
    keep[[s, t]] = False
    b, a = before.double().cpu(), after.double().cpu()
    nonedited = float((a[keep] - b[keep]).abs().max()) if keep.any() else 0.0
    recovered = patched.double().cpu() - (basis @ after).double().cpu()
    moved = float((recovered - residual.double().cpu()).abs().max())
    scale = max(1.0, float(residual.abs().max()), float(b.abs().max()))
    tol = 256 * torch.finfo(torch.float32).eps * scale
    if nonedited > tol or moved > tol:
        raise RuntimeError(f"the coordinate patch moved what it keeps (another coordinate by {nonedited:.3g}, the "
                           f"residual by {moved:.3g})")
    return nonedited, moved


def solve_coordinate_patch(x: torch.Tensor, dictionary: torch.Tensor, source: int, target: int, *,
                           decomposition: JSpaceDecomposition | None = None, k: int = DEFAULT_K,
                           mode: str = "substitute", alpha: float = 1.0, algorithm: str = "omp") -> CoordinatePatch:
    """The anchored edit of ``x``'s coordinates over ``dictionary`` (module docstring): the model-free step of
    :func:`rs_interp.coordinate_patch`. A ``decomposition`` given is checked to be one of ``x``.

    Raises:
        ValueError: an unknown mode, the same atom twice, a source outside the active support, a non-finite
            ``alpha``, or a decomposition of something else.
        RuntimeError: the edit moved a coordinate or the residual it keeps.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(float(alpha)):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
    x, D = check_inputs(x, dictionary)
    source = check_int_range("source", source, 0, D.shape[0] - 1)
    target = check_int_range("target", target, 0, D.shape[0] - 1)
    if source == target:
        raise ValueError("source and target are the same atom")
    if decomposition is None:
        decomposition = sparse_decomposition(x, D, k, algorithm=algorithm)
    else:
        _check_decomposition(decomposition, x, D)
    support = decomposition.support.cpu()
    if source not in support.tolist():
        raise ValueError(f"the source ({source}) is not in the decomposition's active support {support.tolist()}")
    appended = target not in support.tolist()
    frame = torch.cat([support, torch.tensor([target])]) if appended else support.clone()
    before = decomposition.coordinates.to(x.dtype)
    before = torch.cat([before, before.new_zeros(1)]) if appended else before.clone()
    s, t = frame.tolist().index(source), frame.tolist().index(target)
    after = _edit(before, s, t, mode, float(alpha))
    if bool((after < 0).any()):
        warnings.warn(f"alpha={alpha} moves a coordinate below 0, outside the non-negative frame", UserWarning, 2)
    pair = D[[source, target]]
    pair = pair / pair.norm(dim=1, keepdim=True)
    cosine = float(pair[0] @ pair[1])
    if abs(cosine) >= WARN_COSINE:
        warnings.warn(f"the source and target atoms are near-parallel (cosine {cosine:.6f}): their coordinates are "
                      "poorly separated", UserWarning, stacklevel=2)
    basis = D[frame].T
    normed = basis / basis.norm(dim=0)
    rank = int(torch.linalg.matrix_rank(normed.float()))
    cond = _condition(normed) if rank == basis.shape[1] else math.inf
    if cond > _CONDITION_WARNING:
        warnings.warn(f"the edit's frame is ill-conditioned (condition number {cond:.3g})", UserWarning, stacklevel=2)
    recon = decomposition.reconstruction.to(x.dtype)
    residual = x - recon
    delta = basis @ (after - before)
    patched = x + delta
    nonedited, moved = _witnesses(before, after, s, t, patched, basis, residual)
    return CoordinatePatch(support_before=support, support_after=frame, coordinates_before=before,
                           coordinates_after=after, source_slot=s, target_slot=t, target_was_appended=appended,
                           target_was_selected=target in decomposition.selected_support.tolist(),
                           reconstruction_before=recon, reconstruction_after=recon + delta, residual=residual,
                           delta=delta, patched=patched, nonedited_max_delta=nonedited, residual_max_delta=moved,
                           source_target_cosine=cosine, basis_rank=rank, basis_condition=cond)


@needs("readout", "vocabulary")
def coordinate_patch(
    model: Model,
    lens: JacobianLens,
    activation: torch.Tensor,
    layer: int,
    source: int | str,
    target: int | str,
    *,
    position: int | None = None,
    decomposition: JSpaceDecomposition | None = None,
    k: int = DEFAULT_K,
    mode: str = "substitute",
    alpha: float = 1.0,
    algorithm: str = "omp",
) -> CoordinatePatch:
    """Edit one token's coordinate of an activation at ``layer`` over the vocabulary's J-lens vectors (module
    docstring); the activation as :func:`rs_interp.jspace_decomposition` reads it, tokens as ids or single-token
    strings.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(2, seed=0).tokens
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> dec = ri.jspace_decomposition(model, lens, toks[0], 0, position=-1, k=4)
    >>> patch = ri.coordinate_patch(model, lens, toks[0], 0, int(dec.support[0]), 0, position=-1, decomposition=dec)
    >>> patch.nonedited_max_delta
    0.0
    """
    require(model, "coordinate_patch")
    x = activation_at(model, activation, layer, position, "coordinate_patch")
    s, t = token_ids(model, [source, target])
    return solve_coordinate_patch(x, dictionary(model, lens, layer, "coordinate_patch"), s, t,
                                  decomposition=decomposition, k=k, mode=mode, alpha=alpha, algorithm=algorithm)


@needs("readout", "vocabulary")
def coordinate_patch_hooks(
    model: Model,
    lens: JacobianLens,
    source: int | str,
    target: int | str,
    layers: Sequence[int],
    *,
    positions: Sequence[int],
    decomposition_cache: MutableMapping[tuple[int, int, int], JSpaceDecomposition] | None = None,
    k: int = DEFAULT_K,
    mode: str = "substitute",
    alpha: float = 1.0,
    algorithm: str = "omp",
) -> list[tuple[str, Callable]]:
    """Hooks that patch the coordinate live, at each of ``layers`` and ``positions`` (required: every pair is a
    vocabulary-wide decomposition per run), each ``(batch row, position)`` on its own; ``decomposition_cache``
    (keyed ``(layer, row, position)``) keeps and reuses decompositions, each checked to be of the activation it is
    used on. The edit passes gradients straight through (``x + delta``, ``delta`` a constant).

    Raises:
        ValueError (when the hook runs): the source is not in the active support of a pair at that moment (an
            earlier layer's patch may have removed it); the whole run fails rather than patch some pairs.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> lens = ri.JacobianLens(torch.eye(32)[None], (0,), n_prompts=1)
    >>> [name for name, _ in coordinate_patch_hooks(model, lens, 3, 4, [0], positions=[-1])]
    ['blocks.0.hook_resid_post']
    """
    require(model, "coordinate_patch_hooks")
    if not positions:
        raise ValueError("positions must name at least one position (each is a vocabulary-wide decomposition)")
    s, t = token_ids(model, [source, target])
    if s == t:
        raise ValueError("source and target are the same token")
    dt, hooks = compute_dtype(model), []
    for layer in layers:
        D = dictionary(model, lens, layer, "coordinate_patch_hooks")

        def patch(h: torch.Tensor, at: list[int] | None, layer: int = layer, D: torch.Tensor = D) -> torch.Tensor:
            out = h.clone()
            for b in range(h.shape[0]):
                for col, p in enumerate(at):
                    key = (layer, b, p)
                    dec = None if decomposition_cache is None else decomposition_cache.get(key)
                    if dec is None:
                        dec = sparse_decomposition(h[b, col], D, k, algorithm=algorithm)
                        if decomposition_cache is not None:
                            decomposition_cache[key] = dec
                    edit = solve_coordinate_patch(h[b, col], D, s, t, decomposition=dec, k=k, mode=mode, alpha=alpha)
                    out[b, col] = h[b, col] + edit.delta.to(h.dtype)
            return out

        hooks.append((N.resid_post(layer), position_hook(patch, positions, model.cfg.d_model, dt)))
    return hooks
