"""Running a circuit (private, shared by :mod:`rs_interp.circuits.evaluation` and
:mod:`rs_interp.circuits.acdc`): one forward pass in which every edge outside the circuit is
ablated, each receiver's input moved by ``sum_s cut[s, r] (ablated_s - write_s)`` over its upstream
senders ``s``, exactly (the real norm of the moved input, never a frozen one). On post-norm blocks a head's
``ablated_s - write_s`` is the change in what its attention adds to the stream when only that head's output
is replaced (:func:`rs_interp.exact.postnorm.patched_heads`)."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from .. import _backend
from .. import _names as N
from .._backend import Model
from ..exact.postnorm import attn_post, patched_heads
from ..exact.stream import ablation_values, reader_weight, readers, routed
from ..metrics import Metric, metric_value
from ._substrate import INPUT_POINTS, record, sender_points
from .graph import EdgeLayout


def ablated_writes(model: Model, tokens: torch.Tensor, reference: torch.Tensor | None, ablation: str,
                   embedding: str = "sum") -> dict[str, torch.Tensor]:
    """Per sender point, what an ablated sender writes, with the run's batch size."""
    B, P = tokens.shape
    points = sender_points(model, embedding)
    if ablation == "zero":
        return {k: torch.zeros_like(v) for k, v in record(model, tokens, points).items()}
    values = ablation_values(model, reference, ablation, points)
    return values if ablation == "resample" else {k: v.expand(B, P, *v.shape[2:]) for k, v in values.items()}


def run_circuit(model: Model, tokens: torch.Tensor, metric: Metric, layout: EdgeLayout, keep: torch.Tensor,
                 ablated: dict[str, torch.Tensor], what: str, masks: torch.Tensor | None = None) -> float:
    """The metric with every edge outside ``keep`` (sender, receiver) ablated, in one forward pass; with
    ``masks`` (span, batch, pos, 1), ``keep`` is (sender, receiver, span): a positional edge outside it is
    ablated at its span's positions only (:mod:`rs_interp.circuits.positions`).

    A head's q, k or v input is moved one of two ways, chosen per layer (the same numbers either way, to
    float64 rounding: tests/circuits/test_evaluation.py checks both against a brute force):

    - *projected*, on the layers whose ``hook_{q,k,v}`` hold ``ln1(resid_pre) W + b`` per head
      (:func:`rs_interp._backend.projection_layers`: every layer but shortformer's and ungrouped
      grouped-query attention on 3.x, TransformerLens-native attention on 4.x; the certificate checks
      it as ``projections``). The heads of a layer and kind whose columns of ``cut`` are equal read the
      same input ``resid_pre + sum_s cut[s, r] D_s``, so it is formed and normalised (the exact norm of
      the moved input, not a frozen one) once per distinct column, each of those heads projected from
      it, and written into ``hook_{q,k,v}``; a head with no cut edge that moves anything keeps the
      model's own projection. In a faithfulness curve most heads have every edge cut or none, so a
      layer costs one or two norms and at most one projection's worth of matmuls, not a per-head copy
      of the stream and its norm (4.x's emulated per-head inputs).
    - *split*, elsewhere (a Hugging Face module's projection may be followed inside by more, such as
      a query norm; shortformer queries and keys read the positions too): TransformerLens's per-head
      inputs ``hook_{q,k,v}_input`` (:func:`rs_interp._backend.per_head_inputs`), the value added there.
    """
    run = _CircuitRun(model, layout, keep, ablated, masks)
    fwd, split = run.hooks()
    # The per-head inputs are switched on (3.x) or emulated (4.x's native attention) only where a
    # layer is read split: on the projected layers they would be a per-head copy of the stream for nothing.
    with routed(model, fwd, split=split) as runnable, model.hooks(fwd_hooks=runnable):
        return metric_value(metric(model(tokens, return_type="logits")), what)


class _CircuitRun:
    """One run of a circuit (:func:`run_circuit`): the edges to cut, the senders' differences as they fire
    (:class:`_Differences`), and the hooks that record them and move each receiver's input."""

    def __init__(self, model: Model, layout: EdgeLayout, keep: torch.Tensor, ablated: dict[str, torch.Tensor],
                 masks: torch.Tensor | None) -> None:
        self.model, self.ablated = model, ablated
        exists = layout.exists if masks is None else layout.exists[..., None]
        cut = (exists & ~keep).to(torch.float64)  # (sender, receiver[, span]): edges to ablate
        self.column = {r: j for j, r in enumerate(layout.receivers)}
        # the input senders' hooks, in order
        self.inputs = [INPUT_POINTS[s] for s in layout.senders if s in INPUT_POINTS]
        device = ablated[self.inputs[0]].device
        self.cut = cut.to(device)
        # Which senders' differences are not exactly 0: an edge whose sender changes nothing is no cut at
        # all (the split path adds an exact 0; the projected path must not recompute a head for it, or a
        # head's value would move by rounding when such an edge is cut, and ACDC at threshold 0 would keep it)
        self.moves = torch.zeros(len(layout.senders), dtype=torch.float64, device=device)
        self.diffs = _Differences(self.moves)
        self.stream: dict[int, torch.Tensor] = {}
        self.is_z = N.every(N.z)
        self.span_masks = None if masks is None else masks.to(device=device, dtype=torch.float64)

    def moved_by(self, col: torch.Tensor) -> torch.Tensor | None:
        """The sum of the cut senders' differences of one receiver: ``col`` (sender,) or, per span, (sender, span)."""
        diffs = self.diffs
        if col.ndim == 1:
            return diffs.sum(col) if bool(col.any()) else None
        out = None
        for u in range(col.shape[1]):
            if bool(col[:, u].any()):
                part = diffs.sum(col[:, u]) * self.span_masks[u]
                out = part if out is None else out + part
        return out

    def cuts(self, cols: list[int]) -> torch.Tensor:
        """The cut edges into ``cols`` from the senders recorded so far that move something."""
        n, moves = self.diffs.filled, self.moves
        return self.cut[:n, cols] * (moves[:n, None] if self.cut.ndim == 2 else moves[:n, None, None])

    def sender(self, name: str, layer: int | None):
        model, diffs = self.model, self.diffs

        def fn(t: torch.Tensor, *, hook) -> None:
            d = self.ablated[name] - t  # in the run's dtype: D_s is its float64 value (exactly), or dz W_O for heads
            if self.is_z(name) and attn_post(model, layer, torch.float64).kind is not None:
                # a post-norm block's head: the exact change through the norm after it, P(r + dz_h W_O^h) - P(r),
                # not a product of dz (each head its own sender difference)
                for D_h in patched_heads(model, layer, t, d.to(torch.float64), torch.float64):
                    diffs.add_one(D_h)
            elif self.is_z(name):
                diffs.add_heads(d, model.blocks[layer].attn.W_O.detach())
            else:
                diffs.add_one(d)
        return fn

    def receiver(self, labels: Sequence[str]):
        cols = [self.column[r] for r in labels]

        def fn(t: torch.Tensor, *, hook) -> torch.Tensor | None:
            w = self.cuts(cols)
            if not bool(w.any()):
                return None  # nothing cut into these receivers: their input is the run's own
            if t.ndim == 4:  # per-head inputs
                parts = [self.moved_by(w[:, j]) for j in range(w.shape[1])]
                zero = torch.zeros_like(next(x for x in parts if x is not None))  # a head with nothing cut: an exact 0
                return t + torch.stack([zero if x is None else x for x in parts], 2).to(t.dtype)
            return t + self.moved_by(w[:, 0]).to(t.dtype)

        return fn

    def keep_stream(self, t: torch.Tensor, *, hook) -> None:
        self.stream[N.layer_of(hook.name)] = t

    def projected_receiver(self, r):
        model = self.model
        cols = [self.column[lab] for lab in r.labels]
        W = reader_weight(model, r.layer, f"W_{r.kind.upper()}", len(cols))  # (head or KV head, d_model, d_head)
        b = reader_weight(model, r.layer, f"b_{r.kind.upper()}", len(cols))  # (head or KV head, d_head)
        norm = _backend.pre_norm(model, r.layer, "ln1")

        def fn(t: torch.Tensor, *, hook) -> torch.Tensor | None:
            n = self.diffs.filled
            w = self.cuts(cols)
            live = [h for h, a in enumerate(w.reshape(n, len(cols), -1).any(2).any(0).tolist()) if a]
            if not live:
                return None  # no cut edge into this layer's kind: the model's own projection stands
            groups: dict[tuple[int, ...], list[int]] = {}  # heads with the same column of cut read the same input
            for h in live:
                groups.setdefault(tuple(w[:, h].nonzero().flatten().tolist()), []).append(h)
            x = self.stream[r.layer]
            dt = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
            out = t.clone()
            # Each group's input is formed and normalised on its own, and each head projected on its own
            # (the same shapes whatever the grouping), so a head's number depends on its own column of
            # cut alone, never on how the other heads group: cutting an edge that carries exactly
            # nothing leaves every other value unchanged to the bit (ACDC at threshold 0 relies on it).
            for hs in groups.values():
                moved = x.to(dt) + self.moved_by(w[:, hs[0]]).to(dt)
                normed = norm.apply(moved)
                for h in hs:
                    out[:, :, h] = (normed @ W[h].to(dt) + b[h].to(dt)).to(t.dtype)
            return out

        return fn

    def hooks(self) -> tuple[list, bool]:
        """The hooks in the order the forward pass meets them, senders recorded before their readers, and
        whether a layer is read split (per-head inputs)."""
        model = self.model
        by_layer: dict[int, list] = {}
        split = False
        for r in readers(model, projected=True):
            if r.projected:
                hooks = [(N.resid_pre(r.layer), self.keep_stream)] if r.kind == "q" else []
                by_layer.setdefault(r.layer, []).extend(hooks + [(r.hook, self.projected_receiver(r))])
            else:
                split = split or r.kind in "qkv"
                by_layer.setdefault(r.layer, []).append((r.hook, self.receiver(r.labels)))
        fwd = [(name, self.sender(name, None)) for name in self.inputs]  # hook_embed fires before hook_pos_embed
        for l in range(model.cfg.n_layers):
            layer = by_layer[l]
            heads = {f(l, x) for f in (N.qkv_input, N.projection) for x in "qkv"}
            fwd += [(name, fn) for name, fn in layer if name == N.resid_pre(l)]
            fwd += [(name, fn) for name, fn in layer if name in heads]
            fwd.append((N.z(l), self.sender(N.z(l), l)))
            fwd += [(name, fn) for name, fn in layer if name == N.mlp_in(l)]
            if not model.cfg.attn_only:
                fwd.append((N.mlp_out(l), self.sender(N.mlp_out(l), l)))
            fwd += [(name, fn) for name, fn in layer if name == N.resid_post(l)]
        return fwd, split


class _Block(NamedTuple):
    """One input or MLP sender's difference, or one layer's heads' (:class:`_Differences`)."""

    first: int  # its first sender's index
    count: int  # its senders (1, or the layer's heads)
    d: torch.Tensor  # the difference as the run computed it, or the heads' z difference in float64
    W_O: torch.Tensor | None  # the heads' W_O in float64; None for an input or MLP sender
    F: torch.Tensor | None  # the float64 sum of the moving heads' D_h; None for an input or MLP sender, or none moving


class _Differences:
    """The senders' differences ``D_s = ablated_s - write_s`` (batch, pos, d_model) of one run, in
    layout order as they fire, and their sums over a receiver's cut senders, without holding every
    ``D_s`` in float64 (157 of them on GPT-2 small: 0.65 GB at 32 pairs of 21 tokens; this, about 0.2 GB).

    An input or MLP sender's difference is kept as the run computed it (its float64 value is that,
    exactly); a layer's heads keep their ``z`` difference (batch, pos, head, d_head) and ``W_O``, both
    in float64 (exact copies), and ``F``, the float64 sum of ``D_h = dz_h W_O^h`` over the layer's
    moving heads. The sum over a column ``w`` of cut senders adds, in layout order, each input or MLP
    sender's ``D_s`` and each layer's share: ``F`` when every moving head is cut, else ``sum_{h in C}
    D_h`` over the cut heads ``C`` as one product over (head, d_head), or ``F`` minus the uncut moving
    heads' (whichever holds fewer heads). The same column always gives the same number (a function of
    the cut moving senders alone, which ACDC at threshold 0 relies on); it equals the sum over the
    full float64 ``D_s`` to float64 rounding (tests/circuits/test_evaluation.py, against the materialised sums
    and a brute force). The sum over every moving sender so far is kept running: a receiver whose
    upstream senders are all cut (most, in small circuits) costs nothing more. A circuit that mixes
    many inputs pays a product per distinct share (GPT-2 small's curve: 3 CPU s a pass for the small
    circuits, 10-13 s at a fifth to half of the edges).
    """

    def __init__(self, moves: torch.Tensor) -> None:
        self.moves = moves  # (sender,) float64 0/1, filled here as the senders fire
        self.filled = 0  # senders recorded so far: the upstream ones of the next receiver
        self.blocks: list[_Block] = []
        self.full: torch.Tensor | None = None  # the sum over every moving sender so far (the all-cut column)

    def add_one(self, d: torch.Tensor) -> None:
        i = self.filled
        self.moves[i] = float(bool(d.ne(0).any()))
        self._add(_Block(i, 1, d, None, None))

    def add_heads(self, dz: torch.Tensor, W_O: torch.Tensor) -> None:
        i, H = self.filled, W_O.shape[0]
        dz, W_O = dz.to(torch.float64), W_O.to(torch.float64)  # (exact) kept in float64 for the partial sums
        D = torch.einsum("bphd,hdm->hbpm", dz, W_O)  # each head's D_h, for now
        moving = D.flatten(1).ne(0).any(1)
        self.moves[i : i + H] = moving.to(torch.float64)
        F = None if not bool(moving.any()) else D.sum(0) if bool(moving.all()) else D[moving].sum(0)
        self._add(_Block(i, H, dz, W_O, F))

    def _add(self, block: _Block) -> None:
        self.blocks.append(block)
        self.filled += block.count
        term = self._term(block, self.moves[block.first : self.filled].bool())
        if term is not None:
            self.full = term.clone() if self.full is None else self.full + term

    def sum(self, w: torch.Tensor) -> torch.Tensor:
        """``sum_s w[s] D_s`` over the recorded senders for a 0/1 column ``w`` of cut moving senders (not all 0)."""
        if torch.equal(w, self.moves[: self.filled]):
            return self.full
        out = None
        for block in self.blocks:
            term = self._term(block, w[block.first : block.first + block.count].bool())
            if term is not None:
                out = term.clone() if out is None else out.add_(term)
        return out

    def _term(self, block: _Block, cut: torch.Tensor) -> torch.Tensor | None:
        """A block's share of a sum: its cut moving senders' ``sum D_s`` (None: none cut)."""
        i, count, d, W_O, F = block
        n_cut = int(cut.sum())
        if not n_cut:
            return None
        if W_O is None:  # an input or MLP sender (a layer of one head is a block of heads)
            return d.to(torch.float64)
        moving = self.moves[i : i + count].bool()
        if n_cut == int(moving.sum()):
            return F
        return _heads(d, W_O, cut) if n_cut <= int(moving.sum()) - n_cut else F - _heads(d, W_O, moving & ~cut)


def _heads(dz: torch.Tensor, W_O: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    """``sum_{h in which} dz_h W_O^h`` (batch, pos, d_model) in float64: one product over (head, d_head)."""
    idx = which.nonzero().flatten()
    return torch.einsum("bphd,hdm->bpm", dz[:, :, idx], W_O[idx])
