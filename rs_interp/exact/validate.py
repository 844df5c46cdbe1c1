"""Input checks shared by the helpers: every failure is a ``ValueError`` naming the argument."""

from __future__ import annotations

import operator
from typing import Iterable, Literal

import torch
from jaxtyping import Int

from .._backend import Model

__all__: list[str] = []


def as_int(name: str, value: object) -> int:
    """``value`` as a Python int if it is integer-like (``int``, a numpy integer, a 0-d integer
    tensor: anything with ``__index__``); ``ValueError`` naming ``name`` otherwise (bools and
    floats such as ``0.5`` are refused, never truncated)."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if isinstance(value, torch.Tensor) and value.ndim != 0:
        raise ValueError(f"{name} must be an int, got a tensor of shape {tuple(value.shape)}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def check_int_range(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an int if ``low <= value (<= high)``; raise ``ValueError`` naming ``name`` otherwise."""
    value = as_int(name, value)
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_positions(positions: object, n: int, name: str = "positions") -> list[int]:
    """``positions`` (ints in ``[-n, n - 1]``) as indices in ``[0, n - 1]``, in the given order.

    Raises:
        ValueError: not a sequence of ints, an entry out of range, empty, or one position named twice
            (``-1`` and ``n - 1`` are the same position).
    """
    if isinstance(positions, (str, bytes)) or not hasattr(positions, "__iter__"):
        raise ValueError(f"{name} must be a sequence of ints, got {type(positions).__name__}")
    out = [check_int_range(f"{name} entry", p, -n, n - 1) % n for p in positions]
    if not out:
        raise ValueError(f"{name} is empty; pass None for every position, or name at least one")
    twice = sorted({p for p in out if out.count(p) > 1})
    if twice:
        raise ValueError(f"{name} names position(s) {twice} more than once (of {n}; negative entries count from the "
                         "end)")
    return out


def check_layer(model: Model, layer: object, name: str = "layer") -> int:
    return check_int_range(name, layer, 0, model.cfg.n_layers - 1)


def check_head(model: Model, layer: object, head: object, name: str = "head") -> tuple[int, int]:
    return check_layer(model, layer, f"{name} layer"), check_int_range(f"{name} index", head, 0, model.cfg.n_heads - 1)


def _is_scalar(x: object) -> bool:
    return not isinstance(x, (str, bytes)) and (not hasattr(x, "__len__")
                                                or (isinstance(x, torch.Tensor) and x.ndim == 0))


def check_heads(model: Model, heads: object, name: str, *, allow_empty: bool = True) -> list[tuple[int, int]]:
    """Validate a list of ``(layer, head)`` pairs.

    One meaning everywhere: each entry names one head; a bare pair ``(l, h)`` is that one head;
    entries must be integer-like; **a head named twice is refused** (a head's write is counted
    once, never twice). ``ValueError`` naming ``name`` on any violation.
    """
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise ValueError(f"{name} must be a list of (layer, head) pairs, got {type(heads).__name__} {heads!r}")
    entries = list(heads)
    if len(entries) == 2 and all(_is_scalar(x) for x in entries):
        entries = [tuple(entries)]  # a bare pair: one head
    out: list[tuple[int, int]] = []
    for entry in entries:
        if _is_scalar(entry) or isinstance(entry, (str, bytes)) or len(entry) != 2:
            raise ValueError(f"{name} entries must be (layer, head) pairs, got {entry!r}")
        pair = check_head(model, entry[0], entry[1], name=f"{name} entry {tuple(entry)!r}:")
        if pair in out:
            raise ValueError(f"{name} names head {pair} twice; name each head once")
        out.append(pair)
    if not out and not allow_empty:
        raise ValueError(f"{name} is empty; name at least one (layer, head) pair")
    return out


def check_weights(model: Model) -> Model:
    """``model`` if its weights hold data: a model on the ``meta`` device (built with
    ``torch.device("meta")`` or ``init_empty_weights``) has shapes only.

    Raises:
        ValueError: a parameter is on the meta device.
    """
    meta = next((n for n, p in model.named_parameters() if p.is_meta), None)
    if meta is not None:
        raise ValueError(f"the model's weights are on the meta device (no data, e.g. {meta}): load them first "
                         f"(model.to_empty(device='cpu') then load_state_dict, or build it without init_empty_weights)")
    return model


def check_tokens(model: Model, tokens: torch.Tensor, name: str = "tokens") -> Int[torch.Tensor, "batch pos"]:
    """Validate a token tensor for ``model`` (and the model: :func:`check_weights`); a 1-D tensor is
    promoted to a batch of one."""
    check_weights(model)
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype (e.g. torch.long), got {tokens.dtype}")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, pos) or (pos,), got {tuple(tokens.shape)}")
    if tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(tokens.shape)}")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"{name} has {tokens.shape[1]} positions; the model's n_ctx allows at most {model.cfg.n_ctx}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= model.cfg.d_vocab:
        raise ValueError(f"{name} must lie in [0, {model.cfg.d_vocab}) (d_vocab), got values in [{lo}, {hi}]")
    return tokens.long().to(model.cfg.device)


def check_targets(targets: torch.Tensor, tokens: torch.Tensor, d_vocab: int, name: str = "targets") -> torch.Tensor:
    """``targets`` are token ids of shape (batch, pos) matching ``tokens`` (or (pos,) for a batch of one),
    ``-1`` where a position is skipped (e.g. :func:`rs_interp.next_token_targets`' last position)."""
    if not isinstance(targets, torch.Tensor) or targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer torch.Tensor (token ids, -1 to skip a position)")
    if targets.ndim == 1 and tokens.shape[0] == 1:
        targets = targets[None]
    if tuple(targets.shape) != tuple(tokens.shape):
        raise ValueError(f"{name} must have the shape of tokens {tuple(tokens.shape)}, got {tuple(targets.shape)}")
    if int(targets.min()) < -1 or int(targets.max()) >= d_vocab:
        raise ValueError(f"{name} must lie in [0, {d_vocab}) (d_vocab), or be -1 to skip a position")
    return targets.long().to(tokens.device)


def check_target_pair(
    targets: torch.Tensor, contrast: torch.Tensor | None, tokens: torch.Tensor, d_vocab: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Validate ``targets`` (and ``contrast``) for a decomposition: returns them with every skipped
    position (target -1) set to token 0, so they can index, and the (batch, pos) mask of skipped
    positions (their parts are set to 0 by the caller). ``contrast`` may be -1 only where ``targets`` is."""
    targets = check_targets(targets, tokens, d_vocab)
    skip = targets < 0
    if contrast is not None:
        contrast = check_targets(contrast, tokens, d_vocab, "contrast")
        if bool((contrast[~skip] < 0).any()):
            raise ValueError("contrast is -1 at a position whose target is not: skip a position in targets (and "
                             "contrast) together")
        contrast = contrast.masked_fill(skip, 0)
    return targets.masked_fill(skip, 0), contrast, skip


#: What an ablated component writes, one meaning per word everywhere (heads at ``hook_z``, edges'
#: senders in a circuit): ``"zero"`` nothing; ``"mean"`` its mean over the batch *and* positions of
#: ``reference``; ``"position_mean"`` its mean over the batch of ``reference`` at each position;
#: ``"resample"`` its value in the run on ``reference``, sequence by sequence, position by position.
Ablation = Literal["zero", "mean", "position_mean", "resample"]
"""What an ablated component writes (``ablation=`` of :func:`rs_interp.ablate_heads`,
:func:`rs_interp.head_ablation_scan`, :func:`rs_interp.evaluate_circuit`, :func:`rs_interp.acdc` and the faithfulness
curves), one meaning per word: ``"zero"`` nothing; ``"mean"`` its mean over the batch *and* the positions
of ``reference``; ``"position_mean"`` its mean over the batch of ``reference`` at each position;
``"resample"`` its value in the run on ``reference``, sequence by sequence. Which of EAP-IG's (and MIB's)
interventions each equals on a circuit, and which not (EAP-IG's ``"mean"`` is another quantity):
:func:`rs_interp.evaluate_circuit`.

>>> import rs_interp as ri
>>> model, batch = ri.load_toy_model("induction-2l"), ri.induction_batch(8, seed=0)
>>> ablation: ri.Ablation = "position_mean"
>>> tuple(ri.ablate_heads(model, batch.tokens, [(0, 0)], ablation=ablation).shape)
(8, 48, 256)
"""
ABLATIONS = ("zero", "mean", "position_mean", "resample")


def check_ablation(model: Model, tokens: torch.Tensor, ablation: object, reference: torch.Tensor | None,
                   helper: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``tokens`` and the reference ``ablation`` reads, checked: ``reference`` as ``tokens`` for
    ``"resample"`` (required), as long as ``tokens`` for ``"position_mean"``, any length for ``"mean"``
    (both default to ``tokens``); None for ``"zero"``.

    Raises:
        ValueError: an unknown ablation, or a reference of the wrong shape (named with ``helper``).
    """
    if ablation not in ABLATIONS:
        raise ValueError(f"{helper}: ablation must be one of {ABLATIONS}, got {ablation!r}")
    tokens = check_tokens(model, tokens)
    if ablation == "zero":
        return tokens, None
    if reference is None:
        if ablation == "resample":
            raise ValueError(f"{helper}: ablation='resample' needs reference= tokens (the run each ablated value is "
                             "taken from)")
        return tokens, tokens
    reference = check_tokens(model, reference, "reference")
    if ablation == "resample" and reference.shape != tokens.shape:
        raise ValueError(f"{helper}: reference must have the shape of tokens {tuple(tokens.shape)} for resample "
                         f"ablation, got {tuple(reference.shape)}")
    if ablation == "position_mean" and reference.shape[1] != tokens.shape[1]:
        raise ValueError(f"{helper}: reference must have the length of tokens ({tokens.shape[1]} positions) for "
                         f"position_mean ablation, got {reference.shape[1]}")
    return tokens, reference
