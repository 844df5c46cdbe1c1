"""The package's substrate: the two runs of every interchange (the source's activation recorded, the base
run with it written in), a pair set's rows batched by length, and the checks of a pair set against a model.

Each run fires the site's hook exactly once; a hook that fires twice (a model that runs a block twice)
would reuse one source activation for both, so it is refused.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from .. import _backend
from .._backend import Model
from ..exact.readout import d_vocab_out
from .pairs import PairSet
from .sites import Site

__all__: list[str] = []

#: ``(base view, source view) -> new base view``, both (rows, width) or (rows, pos, width).
Intervention = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_pairs(model: Model, pairs: PairSet) -> None:
    """Refuse a pair set the model cannot run: tokens outside its vocabulary, rows longer than its
    context, candidates outside its logits, a numerical output on a model with more than one logit."""
    if not isinstance(pairs, PairSet):
        raise ValueError(f"pairs must be a rs_interp.variables.PairSet, got {type(pairs).__name__}")
    for name in ("base", "source"):
        t, n = getattr(pairs, name), pairs.lengths(name)
        mask = torch.arange(t.shape[1])[None, :] < n[:, None]
        if bool(((t < 0) | (t >= model.cfg.d_vocab))[mask].any()):
            raise ValueError(f"pairs.{name} holds token ids outside the model's vocabulary [0, {model.cfg.d_vocab})")
        if int(n.max()) > model.cfg.n_ctx:
            raise ValueError(f"pairs.{name} has rows of {int(n.max())} tokens, past the model's "
                             f"n_ctx={model.cfg.n_ctx}")
    if pairs.candidates is not None and int(pairs.candidates.max()) >= d_vocab_out(model):
        raise ValueError(f"pairs.candidates name logit {int(pairs.candidates.max())}: the model has "
                         f"{d_vocab_out(model)}")
    if pairs.values is not None and d_vocab_out(model) != 1:
        raise ValueError(f"pairs read a numerical output (values=) but the model has {d_vocab_out(model)} logits, "
                         f"not 1")


def chunks(pairs: PairSet, batch_size: int) -> Iterator[torch.Tensor]:
    """Row indices in batches of at most ``batch_size``, each of one (base length, source length)."""
    for rows in pairs.groups().values():
        for start in range(0, len(rows), batch_size):
            yield torch.tensor(rows[start:start + batch_size], dtype=torch.long)


def inputs(pairs: PairSet, rows: torch.Tensor, side: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(tokens, positions)`` of ``rows`` (one length) of the base or the source, cut to their length."""
    n = int(pairs.lengths(side)[rows[0]])
    tokens = (pairs.base if side == "base" else pairs.source)[rows, :n]
    positions = pairs.base_positions if side == "base" else pairs.source_positions
    return tokens, None if positions is None else positions[rows]


def _fired_once(site: Site, calls: int) -> None:
    if calls != 1:
        raise ValueError(f"{site.hook} fired {calls} times in one forward pass: an interchange needs it once")


def record(model: Model, site: Site, tokens: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """The site's activation on ``tokens``: (rows, width) at ``positions``, or (rows, pos, width)."""
    store: list[torch.Tensor] = []

    def grab(act: torch.Tensor, hook) -> None:
        view = site.view(act)
        rows = torch.arange(view.shape[0], device=view.device)
        store.append((view if positions is None else view[rows, positions.to(view.device)]).detach())

    with model.hooks(fwd_hooks=[(site.hook, grab)]):
        model(tokens)
    _fired_once(site, len(store))
    return store[0]


def intervened(model: Model, site: Site, intervention: Intervention, tokens: torch.Tensor,
               positions: torch.Tensor | None, source: torch.Tensor) -> torch.Tensor:
    """The model's logits on ``tokens`` with ``intervention(base view, source)`` written at the site (at
    ``positions``, or every position); differentiable in the intervention's parameters. A change of the
    stream is also added where the backend says the stream carries it on (``_backend.stream_writes``)."""
    calls, change = 0, {}
    also = _backend.stream_writes(model, site.hook)[1:] if site.kind == "resid" else ()

    def hook(act: torch.Tensor, hook) -> torch.Tensor:
        nonlocal calls
        calls += 1
        view = site.view(act)
        src = source.to(view.device, view.dtype)
        if positions is None:
            new = intervention(view, src)
        else:
            rows, at = torch.arange(view.shape[0], device=view.device), positions.to(view.device)
            new = view.clone()
            new[rows, at] = intervention(view[rows, at], src)
        if also:
            change["delta"] = new - view
        return site.replace(act, new)

    def carry(act: torch.Tensor, hook) -> torch.Tensor:
        return act + change["delta"]

    with model.hooks(fwd_hooks=[(site.hook, hook)] + [(name, carry) for name in also]):
        logits = model(tokens)
    _fired_once(site, calls)
    return logits
