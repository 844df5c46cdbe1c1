"""The identities measured by runs through part of the model or on a few rows, for :mod:`rs_interp.exact._runs`
(which imports them: its :func:`~rs_interp.exact._runs.measure` calls them by name): each block run from its cached
input (``start at layer``), the runs to a layer (``stop at layer``), the stacked and single-row runs (``rows``) and
the runs with the first head's inputs moved (``head inputs``)."""

from __future__ import annotations

from typing import Callable

import torch

from .. import _names as N
from .._backend import Model, Stop, run_from
from . import _checks as C
from ._checks import Missing, get, rel
from .stream import routed

__all__: list[str] = []


def _stop_here(t: torch.Tensor, *, hook) -> None:
    raise Stop

def _start(model: Model, box: dict) -> tuple[float, str]:
    """Each block run from its clean input as the helpers start a run there (:func:`rs_interp._backend.run_from`:
    on 4.x the blocks from that layer alone), ended after that block (:class:`Stop` at its ``hook_resid_post``),
    against the clean run's stream after it; from the last layer, to the logits, against the full run's.

    A run from layer ``l`` is block ``l``, then the run from ``l + 1``, each as started here: the blocks one at a
    time reproduce every run from a layer, at the cost of one forward pass in all (one full run per layer costs
    ``L / 2`` of them). What a started run does differently (ALiBi or a rotary table built at the pass's start,
    the embedding and its hooks skipped) acts on the block it starts at, which is checked."""
    worst, L = C._Worst(), model.cfg.n_layers
    spe = box.get(N.POS_EMBED) if model.cfg.positional_embedding_type == "shortformer" else None
    got: dict[str, torch.Tensor] = {}
    at: list[int] = [-1]  # the layer the current run starts at

    def grab(l: int) -> Callable:
        def fn(t: torch.Tensor, *, hook) -> None:
            if l == at[0]:  # (4.3's own start_at_layer runs the blocks before it too, on input it discards)
                got["x"] = t.detach()
                raise Stop
        return fn

    with torch.no_grad(), model.hooks(fwd_hooks=[(N.resid_post(l), grab(l)) for l in range(L - 1)]):
        for l in range(L - 1):
            got.clear()
            at[0] = l
            try:
                run_from(model, get(box, N.resid_pre(l)), start=l, spe=spe)
            except Stop:
                pass
            worst.see(rel(get(got, "x"), get(box, N.resid_post(l))), f"from layer {l}")
        at[0] = -1
        worst.see(rel(run_from(model, get(box, N.resid_pre(L - 1)), start=L - 1, spe=spe), get(box, "logits")),
                  f"from layer {L - 1}")
    return worst.gap, (f"running from a layer does not reproduce the full run ({worst.where}): TransformerLens's "
                       "start_at_layer "
                       "misses a step of this architecture (the scan and path patching then run every pass from the "
                       "tokens)")


def _stop(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    L, worst = model.cfg.n_layers, C._Worst()
    with torch.no_grad():
        for l in sorted({min(L // 2, 1), L}):  # the helpers run to the end (the lenses, the scan's readout); one inside
            want = get(box, N.resid_pre(l) if l < L else N.final_stream(L))
            worst.see(rel(run_from(model, tokens, stop=l), want), f"stop_at_layer={l}")
    return worst.gap, (f"running to a layer does not return the stream there ({worst.where}): the lenses and the "
                       "scan's readout at chosen positions read the stream it returns")


#: The order of the probe's rows in the rows identity's stacked run: more rows than the probe (a batch of another size),
#: each at other indices than in the probe (row ``i`` of the stack is the probe's row ``(i + 1) % 2``), and every
#: index up to 4 holding a probe row (a hook on any one of them, or on the rows past one, moves a compared row).
_ROWS_ORDER = (1, 0, 1, 0, 1)


def _rows(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    """The probe's rows repeated in another order (:data:`_ROWS_ORDER`), and its second row alone, against the
    clean run's logits of the probe: a helper that stacks copies of a batch along the batch axis needs each row
    to give what it gives alone. A hook that edits a row by index, reads the batch as a whole (a mean) or depends
    on the batch's size moves a row in one of them. (A hook that acts only past these sizes cannot be seen by any
    probe: the docs say so.) Two runs of the probe's size or a little more, the clean run shared."""
    logits = get(box, "logits")
    order = torch.tensor(_ROWS_ORDER, device=tokens.device) % tokens.shape[0]
    worst = C._Worst()
    with torch.no_grad():
        worst.see(rel(model(tokens[order], return_type="logits"), logits[order]), "the rows repeated in another order")
        worst.see(rel(model(tokens[1:2], return_type="logits"), logits[1:2]), "row 1 alone")
    return worst.gap, (f"a row's logits depend on the other rows of its batch ({worst.where} differs): a hook that "
                       "reads or "
                       "edits the batch as a whole (one prompt by index, a batch mean) is attached; helpers that stack "
                       "passes along the batch run one pass per ablation or edge instead")


def _head_input_pass(model: Model, tokens: torch.Tensor, box: dict, xs: str,
                     g: torch.Generator) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
    """One pass through the per-head inputs (:func:`rs_interp.exact.stream.routed`) with the first slot of each
    of ``xs``'s inputs (``q``, ``k``, ``v``: a head's, or a KV head's) moved in every layer and the stream entering
    each layer pinned to the clean run's, ended after the last layer's attention: each layer's ``hook_z`` and the
    fewest slots a moved input had (its first slot is read by the heads ``h < n_heads / slots``)."""
    L = model.cfg.n_layers
    got: dict[int, torch.Tensor] = {}
    slots: dict[int, int] = {}

    def pin(l: int) -> Callable:  # keyed by layer: 4.x calls a hook by its alias
        return lambda t, *, hook: get(box, N.resid_pre(l)).to(t.dtype)

    def move(l: int) -> Callable:
        def fn(t: torch.Tensor, *, hook) -> torch.Tensor:
            slots[l] = min(slots.get(l, t.shape[2]), t.shape[2])
            d = torch.randn(t[:, :, 0].shape, generator=g, dtype=torch.float64).to(t.dtype)
            d = d * float(t.detach().abs().mean())
            t = t.clone()
            t[:, :, 0] = t[:, :, 0] + d
            return t
        return fn

    def keep(l: int) -> Callable:
        return lambda t, *, hook: got.__setitem__(l, t.detach())

    fwd = [(N.resid_pre(l), pin(l)) for l in range(L)] + [(N.qkv_input(l, x), move(l)) for l in range(L) for x in xs]
    fwd += [(N.z(l), keep(l)) for l in range(L)]
    with torch.no_grad(), routed(model, fwd, split=True) as runnable:
        with model.hooks(fwd_hooks=[*runnable, (N.attn_out(L - 1), _stop_here)]):
            try:
                model(tokens, return_type="logits")
            except Stop:
                pass
    for l in range(L):
        if l not in slots or l not in got:
            raise Missing(N.qkv_input(l, xs[0]) if l not in slots else N.z(l))
    return got, slots


def _head_inputs(model: Model, tokens: torch.Tensor, box: dict) -> tuple[float, str]:
    """One pass with every layer's first head's q, k and v inputs moved (:func:`_head_input_pass`): every head
    that reads none of the moved inputs must keep its output (``hook_z``) the clean run's. Where the keys and values
    are grouped (a KV head read by several heads), a second pass moves the queries alone, so that the other heads
    of the first group are checked too. A norm across the heads' queries after the split (OLMo-2's ``q_norm``,
    were it not applied to each head's own copy) or a hook that reads across the heads moves them."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    g = torch.Generator().manual_seed(11)
    worst = C._Worst()
    passes = ["qkv"]
    while passes:
        xs = passes.pop(0)
        got, slots = _head_input_pass(model, tokens, box, xs, g)
        if xs == "qkv" and any(n < H for n in slots.values()):
            passes.append("q")
        for l in range(L):
            others = [h for h in range(H) if h // (H // slots[l]) != 0]  # the heads that read no moved input
            if others:
                where = f"layer {l}'s " + ", ".join(f"hook_{x}_input" for x in xs)
                worst.see(rel(got[l][:, :, others], get(box, N.z(l))[:, :, others]), where)
    return worst.gap, (f"moving one head's input moves other heads' outputs ({worst.where}): something across "
                       "the heads (a norm over every head's queries or keys, or a hook reading the heads together) "
                       "carries it, so an edge into one head would move the others")
