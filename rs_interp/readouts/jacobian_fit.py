"""Fitting the Jacobian lens (:mod:`rs_interp.readouts.jacobian_lens` defines it): one forward pass per prompt, its
graph kept, and the ``d_model`` backward passes taken from it in batches of cotangents (``torch.autograd.grad(...,
is_grads_batched=True)``: the forward is never replicated), every source layer from the same passes.

The cotangent of output dimension ``i`` is ``e_i`` at every valid target position at once, so the gradient at a
source position ``t`` is ``sum_{t' in V} d h_final[t', i] / d h_l[t]``, which causal attention makes the sum over
``t' >= t``; its mean over the valid source positions is row ``i`` of the prompt's term (the reference's
``jacobian_for_prompt``, ``anthropics/jacobian-lens``'s ``jlens/fitting.py``; TransformerLens 4.3 replicates the
prompt ``dim_batch`` times along the batch instead). The checkpoint is the reference's (``jacobian_sum``, ``n_done``,
``next_idx``, ``source_layers``, ``target_layer``, ``skip_first``).

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> lens = ri.fit_jacobian_lens(model, ri.induction_batch(2, seed=0).tokens, skip_first=4, progress=False)
>>> lens.source_layers, tuple(lens.jacobians.shape)
((0,), (1, 32, 32))
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from jaxtyping import Int

from .. import _backend
from .. import _names as N
from .._backend import Model, Stop
from .._budget import MEMORY_BUDGET
from .._files import read_torch
from .._messages import few
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import Certificate, require
from ..exact.needs import BACKWARD_BY_AUTOGRAD, needs
from ..exact.readout import compute_dtype
from ..exact.validate import check_int_range, check_tokens
from .jacobian_backward import by_hand, prompt_jacobians_by_hand
from .jacobian_basis import stream_basis
from .jacobian_lens import ESTIMATOR, MAX_SEQ_LEN, SKIP_FIRST, JacobianLens, atomic_save, check_metadata

__all__ = ["fit_jacobian_lens", "BACKWARDS"]

#: How the backward passes are taken: the blocks' derivative written out where the certificate allows, else
#: autograd (``"auto"``); autograd's graph always (``"autograd"``).
BACKWARDS = ("auto", "autograd")


@dataclass(frozen=True)
class _Fit:
    """The fit's settings, validated once."""

    source_layers: tuple[int, ...]
    skip_first: int
    max_seq_len: int
    batch_size: int
    d_model: int
    target_layer: int
    by_hand: bool = False
    memory_budget: int = MEMORY_BUDGET

    @classmethod
    def of(cls, model: Model, source_layers, skip_first, max_seq_len, batch_size, memory_budget, backward,
           cert: Certificate) -> "_Fit":
        L = model.cfg.n_layers
        if L < 2:
            raise ValueError("the Jacobian lens reads the blocks before the last: the model has one block")
        layers = tuple(range(L - 1)) if source_layers is None else tuple(
            sorted({check_int_range("source_layers entry", l, -L, L - 2) % L for l in source_layers}))
        if not layers:
            raise ValueError("source_layers is empty")
        skip_first = check_int_range("skip_first", skip_first, 0)
        max_seq_len = check_int_range("max_seq_len", max_seq_len, skip_first + 2)
        check_int_range("memory_budget", memory_budget, 1)
        if batch_size is None:
            batch_size = _batch_size(model, min(max_seq_len, model.cfg.n_ctx), memory_budget)
        batch_size = check_int_range("batch_size", batch_size, 1)
        if backward not in BACKWARDS:
            raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
        hand = backward == "auto" and by_hand(model, cert) is None
        return cls(layers, skip_first, max_seq_len, min(batch_size, model.cfg.d_model), model.cfg.d_model, L - 1, hand,
                   memory_budget)


#: Cotangents per backward pass at most by default: more amortise the graph's walk no further on a CPU and
#: only fill the caches (measured on GPT-2's shape, 128 tokens: 16 beat 8, 48 and 128).
_COTANGENTS = 16


def _batch_size(model: Model, pos: int, budget: int) -> int:
    """Cotangents per backward within ``budget`` bytes: per cotangent, a block's backward transients (a
    few streams, the MLP's hidden layer twice, the attention's scores and pattern), at most
    :data:`_COTANGENTS`."""
    cfg = model.cfg
    elem = torch.finfo(compute_dtype(model)).bits // 8
    d_mlp = 0 if cfg.attn_only else (cfg.d_mlp or 4 * cfg.d_model)
    per = elem * pos * (4 * cfg.d_model + 2 * d_mlp + 2 * cfg.n_heads * pos)
    return max(1, min(_COTANGENTS, budget // per))


def _prompt_tokens(model: Model, prompts: Any, max_seq_len: int) -> list[torch.Tensor]:
    """Each prompt as (1, pos) token ids, at most ``max_seq_len``: rows of a (batch, pos) tensor, 1-D
    tensors, or strings (``model.to_tokens``, as the reference and TransformerLens 4.3 tokenize)."""
    if isinstance(prompts, (str, torch.Tensor)):
        prompts = [prompts] if isinstance(prompts, str) or prompts.ndim == 1 else list(prompts)
    out = []
    for p in prompts:
        t = model.to_tokens(p) if isinstance(p, str) else p
        out.append(check_tokens(model, t[..., :max_seq_len] if t.ndim == 1 else t[:, :max_seq_len]))
        if out[-1].shape[0] != 1:
            raise ValueError(f"each prompt must be one sequence; got shape {tuple(out[-1].shape)}")
    if not out:
        raise ValueError("prompts is empty")
    return out


class _Frozen:
    """The parameters' ``requires_grad`` off for the duration (so the graph starts at the first source
    layer and holds no weight's gradient path), restored after."""

    def __init__(self, model: Model) -> None:
        self.saved = [(p, p.requires_grad) for p in model.parameters()]

    def __enter__(self) -> None:
        for p, _ in self.saved:
            p.requires_grad_(False)

    def __exit__(self, *exc: object) -> None:
        for p, flag in self.saved:
            p.requires_grad_(flag)


def _forward(model: Model, tokens: torch.Tensor, fit: _Fit) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward pass keeping its graph: the final stream and each source layer's stream (the first a
    leaf that requires grad, so the graph starts there), the pass ended at the final stream."""
    names = [N.resid_post(l) for l in fit.source_layers]
    final = N.final_stream(model.cfg.n_layers)
    box: dict[str, torch.Tensor] = {}

    def capture(name: str) -> Callable:
        def fn(x: torch.Tensor, *, hook: Any) -> torch.Tensor:
            if name == names[0]:
                x = x.detach().requires_grad_(True)
            box[name] = x
            if name == final:
                raise Stop  # the unembedding is not read
            return x

        return fn

    try:
        with torch.enable_grad(), model.hooks(fwd_hooks=[(n, capture(n)) for n in [*names, final]]):
            model(tokens, return_type=None)
    except Stop:
        pass
    if final not in box or any(n not in box for n in names):
        missing = [n for n in [*names, final] if n not in box]
        raise ValueError(f"the Jacobian lens reads {few(missing)}, which the forward pass never reached.")
    return box[final], [box[n] for n in names]


def _prompt_jacobians(model: Model, tokens: torch.Tensor, fit: _Fit, dt: torch.dtype) -> torch.Tensor:
    """(layer, d_model, d_model): one prompt's term of the estimator, every source layer from the same
    ``d_model`` backward passes, ``fit.batch_size`` cotangents at a time."""
    P, d = tokens.shape[1], fit.d_model
    valid = torch.arange(fit.skip_first, P - 1, device=tokens.device)
    target, sources = _forward(model, tokens, fit)
    out = torch.empty(len(sources), d, d, dtype=dt)
    for s in range(0, d, fit.batch_size):
        n = min(fit.batch_size, d - s)
        rows = torch.arange(n, device=tokens.device)
        cot = target.new_zeros((n, *target.shape))
        cot[rows[:, None], 0, valid[None, :], s + rows[:, None]] = 1  # e_i at every valid target position
        grads = torch.autograd.grad(target, sources, cot, retain_graph=s + n < d, is_grads_batched=True,
                                    allow_unused=True)
        for i, g in enumerate(grads):
            if g is None:
                raise ValueError(f"the final stream does not depend on {N.resid_post(fit.source_layers[i])}: its hook "
                                 "point is off the forward path, so no lens can be fitted there")
            out[i, s: s + n] = g[:, 0, valid].to(dt).mean(1)
    return out


def _prompt_term(model: Model, tokens: torch.Tensor, fit: _Fit, dt: torch.dtype) -> torch.Tensor:
    if fit.by_hand:
        return prompt_jacobians_by_hand(model, tokens, fit.source_layers, fit.skip_first, fit.batch_size, dt,
                                        fit.memory_budget)
    return _prompt_jacobians(model, tokens, fit, dt)


def _metadata(model: Model, fit: _Fit, corpus: str | None, extra: dict | None, n_prompts: int, basis: str) -> dict:
    own = {"model_name": getattr(model.cfg, "model_name", None), "estimator": ESTIMATOR, "corpus": corpus,
           "n_prompts": n_prompts, "fit_dtype": str(compute_dtype(model)).removeprefix("torch."),
           "target_layer": fit.target_layer, "max_seq_len": fit.max_seq_len, "skip_first_positions": fit.skip_first,
           "hook_convention": "blocks.{layer}.hook_resid_post", "stream_basis": basis, "rs_interp_fit": True,
           "transformer_lens_version": _backend.TL_VERSION}
    clash = sorted(set(own) & set(extra or {}))
    if clash:
        raise ValueError(f"metadata cannot set the fit's own provenance keys {clash}")
    meta = dict(extra or {}) | own
    check_metadata(meta)
    return meta


def _resume(path: Path, fit: _Fit, dt: torch.dtype) -> tuple[torch.Tensor, int, int]:
    """``(jacobian_sum, n_done, next_idx)`` from the reference's checkpoint at ``path``.

    Raises:
        ValueError: a checkpoint of other source layers, target layer, skipped positions or width.
    """
    state = read_torch(path, "Jacobian lens fit checkpoint")
    for key, want in (("source_layers", list(fit.source_layers)), ("target_layer", fit.target_layer),
                      ("skip_first", fit.skip_first)):
        if key in state and state[key] != want:
            raise ValueError(f"the checkpoint {path} was fitted with {key}={state[key]!r}, not {want!r}; "
                             "pass resume=False to start again")
    sums = state["jacobian_sum"]
    if sorted(int(l) for l in sums) != list(fit.source_layers) or sums[next(iter(sums))].shape[-1] != fit.d_model:
        raise ValueError(f"the checkpoint {path} holds other layers or another width than this fit")
    S = torch.stack([sums[l].to(torch.float64) for l in sorted(sums, key=int)])
    return S, int(state["n_done"]), int(state["next_idx"])


def _write_checkpoint(path: Path, S: torch.Tensor, n_done: int, next_idx: int, fit: _Fit, dt: torch.dtype,
                      meta: dict) -> None:
    """The reference's fit checkpoint (its six keys, the running sum in the lens's dtype) and the provenance."""
    atomic_save({"jacobian_sum": {l: S[i].to(dt) for i, l in enumerate(fit.source_layers)}, "n_done": n_done,
                  "next_idx": next_idx, "source_layers": list(fit.source_layers), "target_layer": fit.target_layer,
                  "skip_first": fit.skip_first, "metadata": meta}, path)


@needs("readout", "gradients", adapts=BACKWARD_BY_AUTOGRAD, refuses=("bidirectional attention",))
def fit_jacobian_lens(
    model: Model,
    prompts: Int[torch.Tensor, "batch pos"] | Sequence[str | torch.Tensor],
    *,
    source_layers: Sequence[int] | None = None,
    skip_first: int = SKIP_FIRST,
    max_seq_len: int = MAX_SEQ_LEN,
    batch_size: int | None = None,
    memory_budget: int = MEMORY_BUDGET,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    resume: bool = True,
    corpus: str | None = None,
    metadata: dict | None = None,
    backward: str = "auto",
    progress: bool = True,
) -> JacobianLens:
    """Fit the Jacobian lens of ``model`` on ``prompts`` (the estimator of the module docstring).

    Args:
        model: any ``Model`` (every family the certificate passes; the parameters' ``requires_grad`` is
            switched off during the fit and restored).
        prompts: a (batch, pos) tensor (one prompt a row), or a sequence of prompts, each a 1-D tensor of
            token ids or a string (tokenized by ``model.to_tokens``, as the reference and TransformerLens 4.3
            do). A prompt of at most ``skip_first + 1`` tokens has no valid position: it is skipped with a
            warning and not counted.
        source_layers: blocks whose output to read (default every block but the last; negative counts from
            the end).
        skip_first: leading positions left out of the estimator (16, the reference's).
        max_seq_len: tokens per prompt at most (128, the reference's).
        batch_size: cotangents per backward pass (default: as many as ``memory_budget`` allows, at most 16).
        memory_budget: bytes of one backward pass's transients, when ``batch_size`` is not given.
        checkpoint: a path for the reference's fit checkpoint (``jacobian_sum``, ``n_done``, ``next_idx``, ...),
            written every ``checkpoint_every`` prompts and at the end; with ``resume``, a checkpoint already
            there is continued from its ``next_idx``.
        corpus: a name of the prompts, kept in the provenance.
        metadata: more provenance (values ``torch.load(weights_only=True)`` reads back).
        backward: ``"auto"``: each block's derivative written out where the certificate reads the blocks off the
            weights (:mod:`rs_interp.readouts.jacobian_backward`: the same numbers, in fewer operations), autograd's
            graph elsewhere; ``"autograd"``: autograd's graph always.
        progress: a bar over the prompts, with the time left.

    Raises:
        ValueError: the certificate cannot vouch for the model (the identities ``readout``: the final stream is
            what the unembedding reads, and ``gradients``), attention that is not causal (``bidirectional
            attention``: the estimator's sum over ``t' >= t`` is causality's), a source layer off the forward
            path, or no prompt long enough.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> lens = fit_jacobian_lens(model, ri.induction_batch(2, seed=0).tokens, skip_first=4, progress=False)
    >>> lens.n_prompts, lens.metadata["skip_first_positions"]
    (2, 4)
    """
    cert = require(model, "fit_jacobian_lens")
    fit = _Fit.of(model, source_layers, skip_first, max_seq_len, batch_size, memory_budget, backward, cert)
    check_int_range("checkpoint_every", checkpoint_every, 1)
    tokens = _prompt_tokens(model, prompts, fit.max_seq_len)
    dt = compute_dtype(model)
    lens_dt = torch.float64 if dt == torch.float64 else torch.float32
    basis = stream_basis(model)
    meta = _metadata(model, fit, corpus, metadata, 0, basis)
    path = None if checkpoint is None else Path(checkpoint)
    S, done, start = torch.zeros(len(fit.source_layers), fit.d_model, fit.d_model, dtype=torch.float64), 0, 0
    if path is not None and resume and path.exists():
        S, done, start = _resume(path, fit, dt)
    with preserve_state(model), _Frozen(model):
        for i in bar(range(start, len(tokens)), desc="J-lens fit", enabled=progress, unit="prompt"):
            t = tokens[i]
            if t.shape[1] <= fit.skip_first + 1:
                warnings.warn(f"prompt {i} has {t.shape[1]} tokens, no valid position past skip_first={fit.skip_first} "
                              "and before the last: skipped", stacklevel=2)
            else:
                S += _prompt_term(model, t, fit, dt).to(torch.float64)
                done += 1
            if path is not None and ((i + 1) % checkpoint_every == 0 or i + 1 == len(tokens)):
                _write_checkpoint(path, S, done, i + 1, fit, lens_dt, meta | {"n_prompts": done})
    if done == 0:
        raise ValueError(f"no prompt has more than skip_first + 1 = {fit.skip_first + 1} tokens: nothing was fitted")
    return JacobianLens((S / done).to(lens_dt), fit.source_layers, n_prompts=done, metadata=meta | {"n_prompts": done})
