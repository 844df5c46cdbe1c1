"""Interventions along Jacobian-lens vectors (Gurnee et al. 2026, Methods), as hooks on the stream after a block.

The J-lens vector of token ``t`` at layer ``l`` is ``v_t = J_l^T W_U[:, t]`` (:func:`lens_vectors`): the direction of
the stream at ``l`` that the lens reads as ``t``'s logit. Each factory returns ``[(hook name, fn), ...]`` for
``model.hooks(fwd_hooks=...)`` at ``blocks.l.hook_resid_post``, acting at ``positions`` (default every position;
negative counts from the end of each run's sequence), in the model's compute dtype:

- :func:`lens_steering_hooks`: ``h <- h + alpha * median ||h|| * v_t / ||v_t||``, the median over the positions
  acted on (norm-matched: attention sinks' large norms do not set the scale; the reference's protocol);
- :func:`lens_ablation_hooks`: ``h <- h - Q Q^T h``, ``Q`` an orthonormal basis of the tokens' vectors;
- :func:`lens_swap_hooks`: with ``V = [v_s, v_t]`` and the coordinates ``c = V^+ h``, ``h <- h + alpha V (c' - c)``,
  ``c'`` the two coordinates exchanged (or, with ``clamp_to``, a clean run's exchanged: the clamp); the component
  of ``h`` orthogonal to ``span{v_s, v_t}`` is untouched.

They follow TransformerLens 4.3's ``JacobianLens.steering_hooks``, ``ablation_hooks`` and ``swap_hooks``.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> toks = ri.induction_batch(2, seed=0).tokens
>>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
>>> with model.hooks(fwd_hooks=lens_steering_hooks(model, lens, 7, [0], alpha=2.0)):
...     steered = model(toks)
>>> tuple(steered.shape)
(2, 48, 256)
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Sequence

import torch
from jaxtyping import Float

from .. import _names as N
from .._backend import Model
from .._messages import few
from ..exact.certificate import require
from ..exact.needs import needs
from ..exact.readout import compute_dtype, d_vocab_out
from ..exact.validate import check_int_range
from .jacobian_basis import in_model_basis
from .jacobian_lens import JacobianLens

__all__ = ["lens_vectors", "lens_steering_hooks", "lens_ablation_hooks", "lens_swap_hooks", "token_ids",
           "position_hook", "check_pair"]

Token = int | str
#: Two lens vectors whose |cosine| reaches this span an ill-conditioned pair: a swap between them warns
#: (TransformerLens 4.3's threshold).
WARN_COSINE = 0.99
#: ... and past this, is refused (inverting a near-collinear basis is hopeless).
REFUSE_COSINE = 0.999


def token_ids(model: Model, tokens: Token | Sequence[Token]) -> list[int]:
    """Token ids from ids or single-token strings (``model.to_single_token``).

    Raises:
        ValueError: an id outside the vocabulary, or a string that is not one token.
    """
    items = [tokens] if isinstance(tokens, (int, str)) or (isinstance(tokens, torch.Tensor) and tokens.ndim == 0) \
        else list(tokens)
    if not items:
        raise ValueError("no token given")
    out = []
    for t in items:
        if isinstance(t, str):
            try:
                out.append(int(model.to_single_token(t)))
            except (AssertionError, ValueError, KeyError) as err:
                raise ValueError(f"{t!r} is not a single token of this model's tokenizer") from err
        else:
            out.append(check_int_range("token", t, 0, d_vocab_out(model) - 1))
    return out


@needs("readout", "vocabulary")
def lens_vectors(model: Model, lens: JacobianLens, tokens: Token | Sequence[Token],
                 layer: int) -> Float[torch.Tensor, "n d_model"]:
    """``v_t = J_layer^T W_U[:, t]`` for each token (ids or single-token strings), a row each, in the model's
    basis and compute dtype.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> lens = ri.JacobianLens(torch.eye(32)[None], (0,), n_prompts=1)
    >>> torch.equal(lens_vectors(model, lens, [3, 5], 0), model.W_U[:, [3, 5]].T.detach())
    True
    """
    require(model, "lens_vectors")
    return _vectors(model, lens, token_ids(model, tokens), layer, "lens_vectors")


def _vectors(model: Model, lens: JacobianLens, ids: list[int], layer: int, helper: str) -> torch.Tensor:
    if layer not in lens.source_layers:
        raise ValueError(f"{helper}: layer {layer} is not one of the lens's source layers {few(lens.source_layers)}.")
    J = in_model_basis(lens, model, helper)[lens.source_layers.index(layer)]
    return (J.T @ model.W_U.detach()[:, ids].to(J.dtype)).T


def _units(vectors: torch.Tensor, layer: int) -> torch.Tensor:
    norms = vectors.norm(dim=-1, keepdim=True)
    if bool((~torch.isfinite(norms) | (norms <= torch.finfo(vectors.dtype).eps)).any()):
        raise ValueError(f"a lens vector at layer {layer} is zero or not finite: no direction to act along")
    return vectors / norms


def check_pair(units: torch.Tensor, what: str) -> float:
    """The cosine of two unit vectors; warns at |cos| >= 0.99, refuses at >= 0.999 (:data:`WARN_COSINE`)."""
    cos = float(units[0] @ units[1])
    if not abs(cos) < REFUSE_COSINE:
        raise ValueError(f"{what} are near-parallel (|cosine| {abs(cos):.6f} >= {REFUSE_COSINE}): no exchange of their "
                         "coordinates is well defined; choose better-separated tokens")
    if abs(cos) >= WARN_COSINE:
        warnings.warn(f"{what} are poorly conditioned (|cosine| {abs(cos):.6f}): the intervention may be amplified",
                      UserWarning, stacklevel=3)
    return cos


def _positions(positions: Sequence[int] | None, n: int) -> list[int] | None:
    if positions is None:
        return None
    out = [check_int_range("positions entry", p, -n, n - 1) % n for p in positions]
    if len(set(out)) != len(out):
        raise ValueError(f"positions names a position twice (of {n}): {few(positions)}.")
    return out


def position_hook(transform: Callable[[torch.Tensor, list[int] | None], torch.Tensor], positions: Sequence[int] | None,
                  d_model: int, dt: torch.dtype) -> Callable[..., torch.Tensor]:
    """A hook applying ``transform(selected, positions)`` to the stream at ``positions`` (normalised against each run's
    length; None: every position), in ``dt``, the result cast back to the stream's dtype."""
    if positions is not None and len(positions) == 0:
        raise ValueError("positions is empty; pass None for every position")

    def fn(x: torch.Tensor, *, hook: Any) -> torch.Tensor:
        if x.ndim != 3 or x.shape[-1] != d_model:
            raise ValueError(f"{getattr(hook, 'name', 'the hook point')} holds shape {tuple(x.shape)}, not "
                             f"(batch, pos, {d_model})")
        at = _positions(positions, x.shape[1])
        selected = (x if at is None else x[:, at]).to(dt)
        out = transform(selected, at).to(x.dtype)
        if at is None:
            return out
        x = x.clone()
        x[:, at] = out
        return x

    return fn


@needs("readout", "vocabulary")
def lens_steering_hooks(model: Model, lens: JacobianLens, token: Token, layers: Sequence[int], *, alpha: float = 4.0,
                        positions: Sequence[int] | None = None) -> list[tuple[str, Callable]]:
    """Hooks steering the stream after each of ``layers`` toward ``token``: ``h + alpha * median ||h|| * v / ||v||``
    (module docstring); ``alpha = 0`` changes nothing.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> lens = ri.JacobianLens(torch.eye(32)[None], (0,), n_prompts=1)
    >>> [name for name, _ in lens_steering_hooks(model, lens, 7, [0])]
    ['blocks.0.hook_resid_post']
    """
    require(model, "lens_steering_hooks")
    (tid,) = token_ids(model, token)
    dt, hooks = compute_dtype(model), []
    for layer in layers:
        unit = _units(_vectors(model, lens, [tid], layer, "lens_steering_hooks"), layer)[0]

        def steer(h: torch.Tensor, at: list[int] | None, unit: torch.Tensor = unit) -> torch.Tensor:
            return h + alpha * h.norm(dim=-1).median() * unit

        hooks.append((N.resid_post(layer), position_hook(steer, positions, model.cfg.d_model, dt)))
    return hooks


@needs("readout", "vocabulary")
def lens_ablation_hooks(model: Model, lens: JacobianLens, tokens: Token | Sequence[Token], layers: Sequence[int], *,
                        positions: Sequence[int] | None = None) -> list[tuple[str, Callable]]:
    """Hooks projecting the tokens' lens vectors out of the stream after each of ``layers``: ``h - Q Q^T h``, ``Q`` an
    orthonormal basis of their span (one projection: related tokens' vectors are far from orthogonal).

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> lens = ri.JacobianLens(torch.eye(32)[None], (0,), n_prompts=1)
    >>> len(lens_ablation_hooks(model, lens, [3, 4], [0]))
    1
    """
    require(model, "lens_ablation_hooks")
    ids = token_ids(model, tokens)
    dt, hooks = compute_dtype(model), []
    for layer in layers:
        units = _units(_vectors(model, lens, ids, layer, "lens_ablation_hooks"), layer)
        left, sv, _ = torch.linalg.svd(units.T, full_matrices=False)
        Q = left[:, sv > sv.max() * max(units.shape) * torch.finfo(sv.dtype).eps]

        def ablate(h: torch.Tensor, at: list[int] | None, Q: torch.Tensor = Q) -> torch.Tensor:
            return h - (h @ Q) @ Q.T

        hooks.append((N.resid_post(layer), position_hook(ablate, positions, model.cfg.d_model, dt)))
    return hooks


def _clean(clamp_to: Mapping[str, torch.Tensor], layer: int, d_model: int) -> torch.Tensor:
    for name in (N.resid_post(layer), f"blocks.{layer}.hook_out"):
        if name in clamp_to:
            x = clamp_to[name]
            if x.ndim != 3 or x.shape[-1] != d_model:
                raise ValueError(f"clamp_to[{name!r}] has shape {tuple(x.shape)}, not (batch, pos, {d_model})")
            return x
    raise ValueError(f"clamp_to has no activation at {N.resid_post(layer)!r} (a clean run's cache)")


@needs("readout", "vocabulary")
def lens_swap_hooks(model: Model, lens: JacobianLens, source: Token, target: Token, layers: Sequence[int], *,
                    alpha: float = 1.0, positions: Sequence[int] | None = None,
                    clamp_to: Mapping[str, torch.Tensor] | None = None) -> list[tuple[str, Callable]]:
    """Hooks exchanging two tokens' coordinates in lens space after each of ``layers``: with ``V = [v_s, v_t]`` and
    ``c = V^+ h``, ``h + alpha V (c' - c)``; ``c'`` is ``c`` exchanged, or with ``clamp_to`` (a clean run's
    activations: ``run_with_cache``'s cache or a dict by hook name) the clean run's exchanged coordinates, fixed
    when the hooks are built (the paper's multi-layer clamp; idempotent at ``alpha = 1``).

    Raises:
        ValueError: the same token twice, near-parallel vectors (|cosine| >= 0.999; 0.99 warns), or a clamp without
            the layer's activation or of another length.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> lens = ri.JacobianLens(torch.eye(32)[None], (0,), n_prompts=1)
    >>> len(lens_swap_hooks(model, lens, 3, 4, [0], alpha=2.0))
    1
    """
    require(model, "lens_swap_hooks")
    s, t = token_ids(model, [source, target])
    if s == t:
        raise ValueError("source and target are the same token: exchanging its coordinate with itself changes nothing")
    dt, hooks = compute_dtype(model), []
    for layer in layers:
        V = _vectors(model, lens, [s, t], layer, "lens_swap_hooks").T  # (d_model, 2)
        check_pair(_units(V.T, layer), f"the lens vectors of tokens {s} and {t} at layer {layer}")
        pinv = torch.linalg.pinv(V)  # (2, d_model)
        fixed = None
        if clamp_to is not None:
            clean = _clean(clamp_to, layer, model.cfg.d_model)
            at = _positions(positions, clean.shape[1])
            fixed = ((clean if at is None else clean[:, at]).to(dt) @ pinv.T)[..., [1, 0]]

        def swap(h: torch.Tensor, at: list[int] | None, V: torch.Tensor = V, pinv: torch.Tensor = pinv,
                 fixed: torch.Tensor | None = fixed) -> torch.Tensor:
            c = h @ pinv.T
            if fixed is not None and (fixed.shape[1] != h.shape[1] or fixed.shape[0] not in (1, h.shape[0])):
                raise ValueError(f"the clamped coordinates have shape {tuple(fixed.shape[:2])}; the run's activation "
                                 f"{tuple(h.shape[:2])}: clamp a run of the same length")
            want = c[..., [1, 0]] if fixed is None else fixed
            return h + alpha * ((want - c) @ V.T)

        hooks.append((N.resid_post(layer), position_hook(swap, positions, model.cfg.d_model, dt)))
    return hooks
