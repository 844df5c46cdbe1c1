"""Per-head input ablation through hooks: what does a layer's key (or query) input need?

``run_with_key_input(model, tokens, layer=1, keep=[(0, h)])`` runs the model with layer 1's key
input replaced by ``x_0 + write(0, h)``: the embedding stream plus the output of the kept heads
(``A^{0h} x_0 W_OV^{0h}``, without the layer's output bias), everything else unchanged. With
``keep=()`` the keys read the embeddings alone, so they cannot see anything earlier layers wrote.

All of it happens in one forward pass: ``x_0`` and the kept heads' ``z`` are recorded as the
pass goes, and the replacement is built when layer ``layer``'s key input hook fires.

>>> from rs_interp import load_toy_model, induction_batch
>>> model = load_toy_model("induction-2l")
>>> logits = run_with_key_input(model, induction_batch(4, seed=0).tokens, layer=1)
>>> tuple(logits.shape)
(4, 48, 256)
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from jaxtyping import Float, Int

from .. import _backend
from .. import _names as N
from .._backend import Model, attn_weight, kv_groups, per_head_inputs
from .._messages import few
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import EDGES, needs
from ..exact.postnorm import frozen_heads
from ..exact.validate import check_heads, check_layer, check_tokens
from ..hooks import replace_heads_with, store

__all__ = ["run_with_key_input", "run_with_query_input", "run_with_input"]


def run_with_input(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    which: Literal["q", "k", "v"],
    layer: int,
    keep: Sequence[tuple[int, int]] = (),
    heads: Sequence[tuple[int, int]] | None = None,
    keep_biases: bool = False,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Run with layer ``layer``'s ``which`` input (for ``heads``, default all) set to ``x_0`` plus the kept heads' writes.

    The replacement is ``x_0 + sum over keep of z^{lh} W_O^{lh}`` (plus every earlier layer's
    ``b_O`` with ``keep_biases=True``). Identity: on an attention-only model, keeping every head
    of the layers below ``layer`` **and** their biases (or a model whose ``b_O`` are zero, as the
    toy models') reproduces the clean run exactly; without the biases it does not where a ``b_O``
    is nonzero. (With MLPs below ``layer`` their writes are never kept.) On post-norm blocks (Gemma-2/3,
    OLMo-2) a kept head's write, and a bias, pass the norm after its attention with that norm's scale
    frozen at the run's (:func:`rs_interp.exact.postnorm.frozen_heads`).

    ``keep`` and ``heads`` are lists of ``(layer, head)`` pairs, as everywhere in rs_interp (a bare
    pair is one head; a head named twice is refused): ``keep`` the writers, before ``layer``;
    ``heads`` the readers whose input is replaced, all in ``layer`` (default: every head of it).
    Under grouped-query attention the query heads of a group share one key and one value input:
    for ``which="k"`` or ``"v"``, ``heads`` must name whole groups (they are replaced per KV head).

    Raises:
        ValueError: layer or head out of range, a ``keep`` head at or after ``layer``, a ``heads``
            entry outside ``layer``, a head named twice, an empty ``heads``, bad tokens, an
            unknown ``which``, or (grouped-query attention) ``heads`` splitting a KV group.
    """
    if which not in ("q", "k", "v"):
        raise ValueError(f"which must be 'q', 'k' or 'v', got {which!r}")
    layer = check_layer(model, layer)
    kept = check_heads(model, keep, "keep")
    for lk, hk in kept:
        if lk >= layer:
            raise ValueError(f"keep entry ({lk}, {hk}) must come before layer {layer} (keep layers must be < layer)")
    head_indices = None
    if heads is not None:
        pairs = check_heads(model, heads, "heads", allow_empty=False)
        outside = [p for p in pairs if p[0] != layer]
        if outside:
            raise ValueError(f"heads entries {outside} are not in layer {layer}: heads names the readers of layer {layer}'s input")
        head_indices = [h for _, h in pairs]
        groups = kv_groups(model.cfg)
        if which in "kv" and groups != model.cfg.n_heads:
            head_indices = _kv_heads(head_indices, model.cfg.n_heads // groups, which, layer)
    tokens = check_tokens(model, tokens)
    # x_0 plus the kept heads' z W_O is a stream only where the stream adds up and a head writes z W_O.
    require(model, "run_with_query_input" if which == "q" else "run_with_key_input")

    box: dict[str, torch.Tensor] = {}
    fwd = [(N.RESID0, store(box, "x0"))]
    post = _backend.has_post_norms(model)
    fwd += [(N.z(l), store(box, f"z{l}")) for l in sorted({l for l, _ in kept} | (set(range(layer)) if post and keep_biases else set()))]

    def new_input(_: torch.Tensor) -> torch.Tensor:
        x = box["x0"]
        if _backend.has_post_norms(model):  # each write through the norm after its attention, scale frozen
            frozen = {l: frozen_heads(model, l, box[f"z{l}"], x.dtype) for l in {l for l, _ in kept}}
            for lk, hk in kept:
                x = x + frozen[lk][0][hk]
            for lb in range(layer) if keep_biases else ():
                x = x + frozen_heads(model, lb, box[f"z{lb}"], x.dtype)[1]
            return x
        for lk, hk in kept:
            x = x + box[f"z{lk}"][:, :, hk, :] @ model.blocks[lk].attn.W_O[hk]
        if keep_biases:
            for lb in range(layer):
                x = x + attn_weight(model.blocks[lb].attn, "b_O", model.cfg.n_heads)
        return x

    fwd.append((N.qkv_input(layer, which), replace_heads_with(new_input, head_indices)))
    with preserve_state(model), torch.no_grad(), per_head_inputs(model, fwd) as runnable:
        with model.hooks(fwd_hooks=runnable):
            return model(tokens, return_type="logits")


def _kv_heads(heads: list[int], size: int, which: str, layer: int) -> list[int]:
    """The KV heads whose groups (``size`` query heads each) ``heads`` names in full."""
    kv = sorted({h // size for h in heads})
    split = [g for g in kv if any(g * size + i not in heads for i in range(size))]
    if split:
        g = split[0]
        raise ValueError(f"grouped-query attention: layer {layer}'s heads {few(((layer, g * size + i) for i in range(size)), 8)} share one "
                         f"{which} input (KV head {g}); heads must name all of them or none")
    return kv


@needs(*EDGES)
def run_with_key_input(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    layer: int,
    keep: Sequence[tuple[int, int]] = (),
    heads: Sequence[tuple[int, int]] | None = None,
    keep_biases: bool = False,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits with layer ``layer``'s keys computed from ``x_0`` plus the writes of the ``keep`` heads.

    ``keep=()`` gives "layer 1's keys read from x_0"; ``heads`` (``(layer, head)`` pairs in
    ``layer``, default all) the heads whose keys change. See :func:`run_with_input` (the identity
    with ``keep_biases``).

    >>> from rs_interp import find_prev_token_head, induction_batch, load_toy_model, score_logits
    >>> model, batch = load_toy_model("induction-2l"), induction_batch(100, seed=1)
    >>> prev = find_prev_token_head(model, batch.tokens)
    >>> x0 = score_logits(run_with_key_input(model, batch.tokens, layer=1), batch.targets)
    >>> kept = score_logits(run_with_key_input(model, batch.tokens, layer=1, keep=[prev]), batch.targets)
    >>> x0.accuracy < 0.2, kept.accuracy > 0.9  # the previous-token head's write is what the keys need
    (True, True)
    """
    return run_with_input(model, tokens, which="k", layer=layer, keep=keep, heads=heads, keep_biases=keep_biases)


@needs(*EDGES)
def run_with_query_input(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    *,
    layer: int,
    keep: Sequence[tuple[int, int]] = (),
    heads: Sequence[tuple[int, int]] | None = None,
    keep_biases: bool = False,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits with layer ``layer``'s queries computed from ``x_0`` plus the writes of the ``keep`` heads.

    The query-side twin of :func:`run_with_key_input` (same arguments, same identity).

    >>> import torch
    >>> from rs_interp import as_dtype, head_labels, induction_batch, load_toy_model
    >>> model = as_dtype(load_toy_model("induction-2l"), torch.float64)
    >>> tokens = induction_batch(4, seed=0).tokens
    >>> every = [(0, h) for h in range(model.cfg.n_heads)]  # keep every earlier head: the clean run
    >>> bool(torch.allclose(run_with_query_input(model, tokens, layer=1, keep=every), model(tokens), atol=1e-10))
    True
    """
    return run_with_input(model, tokens, which="q", layer=layer, keep=keep, heads=heads, keep_biases=keep_biases)
