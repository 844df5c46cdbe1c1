"""Hook points TransformerLens 4.3's native bridges lack, emulated from the ones they have.

A native bridge (``TransformerBridge.boot_native``) wraps ``NativeAttention``, whose forward pass
takes the normalised stream as one tensor: the per-head inputs ``hook_{q,k,v}_input`` never fire
(``set_use_split_qkv_input(True)`` raises), ``hook_attn_scores`` holds the pattern, and
``stop_at_layer=n_layers`` returns logits. Each emulation below states when it can go; a test in
``tests/hooks/test_split_qkv.py`` fails once the installed TransformerLens meets the condition.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch

from .. import _names as N
from .._norm import Norm
from .common import HookName, Stop, logit_softcap, per_query_head, qkv_input_target

__all__ = ["qkv_input_hooks", "score_hooks", "final_stream"]

Hooks = list[tuple[Any, Callable]]


def _prepend(point: Any, fn: Callable) -> Callable[[], None]:
    """Add ``fn`` to the hook point ``point`` ahead of every hook already there; return its remover."""
    handle = point.add_hook(fn, dir="fwd", prepend=True)

    def remove() -> None:
        handle.hook.remove()
        if handle in point.fwd_hooks:
            point.fwd_hooks.remove(handle)

    return remove


def _route(model: Any, fwd: Sequence[tuple[Any, Callable]],
           layers: set[int]) -> tuple[dict[tuple[int, str], list[Callable]], Hooks]:
    """Split ``fwd`` into the per-head input hooks of ``layers`` (by layer and q/k/v, in order)
    and the rest. A name filter (a callable) that matches such a hook name is narrowed to the
    other names, and the hook goes to the emulation for the matching ones."""
    wanted: dict[tuple[int, str], list[Callable]] = {}
    rest: Hooks = []
    for name, fn in fwd:
        if callable(name):
            hits = [n for n in model.hook_dict if name(n) and (t := qkv_input_target(n)) is not None and t[0] in layers]
            for target in sorted({qkv_input_target(n) for n in hits}):  # once per point, not per alias
                wanted.setdefault(target, []).append(fn)
            if hits:
                name = (lambda f, skip: lambda n: f(n) and n not in skip)(name, frozenset(hits))
            rest.append((name, fn))
            continue
        target = qkv_input_target(name)
        if target is not None and target[0] in layers:
            wanted.setdefault(target, []).append(fn)
        else:
            rest.append((name, fn))
    return wanted, rest


def normalise(norm: Norm, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """HookedTransformer's normalisation of ``x`` (any leading shape) by ``norm`` (the model's own, as
    :func:`rs_interp._backend.norm_of` reads it), computed in float32 at least, firing ``module``'s
    ``hook_scale`` and ``hook_normalized`` where HookedTransformer fires them, so a user's hooks there act
    on the per-head inputs as they do on 3.x."""
    if norm.kind is None:
        return x
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    fire = lambda name, t: getattr(module, name)(t) if hasattr(module, name) else t  # noqa: E731
    return norm.affine(fire("hook_normalized", norm.centre(x) / fire("hook_scale", norm.scale(x))))


@contextlib.contextmanager
def qkv_input_hooks(model: Any, fwd: Sequence[tuple[Any, Callable]], layers: set[int],
                    norm_of: Callable[[torch.nn.Module], Norm]) -> Iterator[Hooks]:
    """Run the ``blocks.L.hook_{q,k,v}_input`` hooks of ``fwd`` for the native layers ``layers``.

    Remove when: TransformerLens >= 4.4 (or whichever release first does) accepts
    ``set_use_split_qkv_input(True)`` on ``boot_native`` bridges (4.3 raises NotImplementedError).

    Yields the other hooks of ``fwd``, for the caller to apply with ``model.hooks``. For the
    duration, two hooks are placed ahead of any other on their points: at ``blocks.L.ln1.hook_in``
    the stream is recorded (after every hook on ``hook_resid_pre`` has acted); at
    ``blocks.L.attn.hook_{q,k,v}`` (the per-head projection, before rotary) the per-head input
    ``(batch, pos, head, d_model)`` is formed from it, passed through the user's hooks in order,
    normalised (firing ``ln1.hook_scale`` and ``ln1.hook_normalized``) and projected per head,
    replacing the projection. Hooks on ``hook_{q,k,v}`` then see the result, whenever they were
    added, as on 3.x. One difference stays: ``ln1``'s hooks also fire on the model's own
    (batch, pos, d_model) pass, which feeds the projections not emulated.
    """
    wanted, rest = _route(model, fwd, layers)
    stream: dict[int, torch.Tensor] = {}
    removers: list[Callable[[], None]] = []
    try:
        for layer in sorted({l for l, _ in wanted}):
            def keep(x: torch.Tensor, *, hook: Any, layer: int = layer) -> None:
                stream[layer] = x

            removers.append(_prepend(model.hook_dict[N.norm_input(layer, "ln1")], keep))
        for (layer, which), fns in wanted.items():
            point = model.hook_dict[N.projection(layer, which)]
            projection = _projection(model, layer, which, fns, stream, norm_of(model.blocks[layer].ln1))
            removers.append(_prepend(point, projection))
        yield rest
    finally:
        for remove in reversed(removers):
            remove()


def _projection(model: Any, layer: int, which: str, fns: list[Callable], stream: dict[int, torch.Tensor],
                norm: Norm) -> Callable:
    block = model.blocks[layer]
    name = N.qkv_input(layer, which)

    def fn(projected: torch.Tensor, *, hook: Any) -> torch.Tensor:
        W = getattr(block.attn, f"W_{which.upper()}")  # (head, d_model, d_head), native layout
        b = getattr(block.attn, f"b_{which.upper()}")
        heads = projected.shape[-2]
        if W.shape[0] != heads:
            raise NotImplementedError(f"{name}: the projection has {heads} heads, W_{which.upper()} {W.shape[0]} "
                                      f"(grouped-query attention); per-head inputs are not emulated for it")
        x = stream[layer].unsqueeze(-2).expand(*stream[layer].shape[:-1], heads, stream[layer].shape[-1]).clone()
        for user in fns:
            result = user(x, hook=HookName(name))
            x = x if result is None else result
        normed = normalise(norm, block.ln1, x)  # float32 at least: the projection is computed in its dtype
        y = torch.einsum("bphm,hmd->bphd", normed, W.to(normed.dtype))
        y = y if b is None else y + b.to(normed.dtype)  # a Hugging Face projection without a bias (GPT-J's) says None
        return y.to(projected.dtype)

    return fn


def score_hooks(model: Any, layer: int, box: dict[str, torch.Tensor], key: str,
                rotate: Callable[[int, torch.Tensor], torch.Tensor], scale: float) -> Hooks:
    """Hooks recording layer ``layer``'s pre-softmax scores (batch, head, query, key), ``-inf``
    above the diagonal, in ``box[key]``: formed from ``hook_q`` and ``hook_k`` (rotated by
    ``rotate``, divided by ``scale``) when ``hook_pattern`` fires.

    Remove when: TransformerLens >= 4.4 (or whichever release first does) fires
    ``hook_attn_scores`` with the scores on native attention (4.3 fires it with the pattern).
    """
    parts: dict[str, torch.Tensor] = {}

    def grab(name: str) -> Callable:
        def fn(t: torch.Tensor, *, hook: Any) -> None:
            parts[name] = t.detach()
        return fn

    def scores(t: torch.Tensor, *, hook: Any) -> None:
        # Grouped-query attention: hook_k has one entry per KV head, shared by a group of query heads.
        q, k = rotate(layer, parts["q"]), rotate(layer, per_query_head(parts["k"], parts["q"].shape[-2], -2))
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / scale
        n = s.shape[-1]
        box[key] = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))

    return [(N.q(layer), grab("q")), (N.k(layer), grab("k")), (N.pattern(layer), scores)]


def final_stream(model: Any, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The residual stream after the last block (``stop_at_layer=n_layers`` on 3.x): recorded at
    the last ``hook_resid_post`` and the pass ended there, so the unembedding is skipped.

    Remove when: TransformerLens >= 4.4 (or whichever release first does) returns the stream, not
    the logits, for ``stop_at_layer=n_layers``.
    """
    box: dict[str, torch.Tensor] = {}

    def grab(t: torch.Tensor, *, hook: Any) -> None:
        box["x"] = t
        raise Stop

    try:
        with model.hooks(fwd_hooks=[(N.final_stream(model.cfg.n_layers), grab)]):
            model(x, **kwargs)
    except Stop:
        pass
    return box["x"]


def run_from_layer(model: Any, x: torch.Tensor, start: int) -> torch.Tensor:
    """The logits from ``x``, the stream entering block ``start``: that block and the later ones, then
    the final norm and the unembedding, each run as the bridge's own module (its hooks fire as in a full
    pass). 4.3's ``start_at_layer`` runs every block before ``start`` too, on input it then discards, so
    a pass from a late layer cost a whole pass. Used where the blocks need nothing but the stream
    (learned absolute positions, no logit soft-cap, a final norm and unembedding as modules); elsewhere
    (rotary embeddings computed once per pass, ALiBi, a soft-cap) the bridge's own ``start_at_layer``.
    Certified either way by ``start at layer`` (the helpers run from the tokens where it fails).

    Remove when: TransformerLens >= 4.4 (or whichever release first does) skips the blocks before
    ``start_at_layer``.
    """
    if (logit_softcap(model) is not None or model.cfg.positional_embedding_type != "standard"
            or not (hasattr(model, "ln_final") and hasattr(model, "unembed"))):
        return model(x, start_at_layer=start, return_type="logits")
    for block in model.blocks[start:]:
        out = block(x)
        x = out[0] if isinstance(out, tuple) else out
    return model.unembed(model.ln_final(x))
