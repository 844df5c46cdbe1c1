"""Distributed alignment search (DAS; Geiger et al., 2024): learn the subspace whose interchange makes the
model give the high-level model's counterfactual outputs, and train the controls the same way.

DAS trains an orthonormal (width, rank) basis ``B`` (kept orthonormal by PyTorch's ``orthogonal`` parametrisation,
:mod:`rs_interp.variables._orthogonal`) so that the interchange ``h + s (h_s - h) B B^T`` at the site makes the model's
class scores on each pair's base give the pair's counterfactual label: cross-entropy, summed over a batch's pairs and
divided by the batch (so a batch split by length or by ``micro_batch_size`` gives the same gradient), Adam, the model
frozen. The source activations are recorded once, before training. It is TransformerLens 4.3's ``fit_das``, step for
step: the batches are drawn by ``numpy.random.default_rng(seed)``'s permutations as there, and from the same initial
``base`` (``init=``) the losses are the same floats (``tests/variables/test_das.py``). The initial basis is drawn by a
``torch.Generator`` of its own (TransformerLens seeds the global one): the caller's random state is never read or moved,
and the same seed gives the same result.

The controls are trained with the same pairs, rank, budget and initial basis: **arbitrary labels** (a fixed
pseudo-random class per source, :func:`~rs_interp.variables.arbitrary_labels`) and an **untrained model**
(:func:`~rs_interp.variables.untrained_copy`). A learned subspace is evidence only where its held-out
accuracy clearly beats both.

>>> import rs_interp as ri
>>> from rs_interp.variables import DASOptions, das, tracr_pairs, tracr_variables
>>> var = tracr_variables("tracr-hist")["hist_1"]
>>> train, test = tracr_pairs("tracr-hist", "hist_1", n=48, seed=0).split(0.25)
>>> fit = das(ri.load_toy_model("tracr-hist"), train, var.site, DASOptions(rank=var.rank, epochs=2), test=test,
...           controls=(), progress=False)
>>> tuple(fit.basis.shape), len(fit.losses) == 2 * fit.steps_per_epoch
((18, 4), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Literal, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float

from .._backend import Model
from .._messages import few
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import SITES, needs
from ..exact.validate import as_int, check_int_range
from ._orthogonal import OrthogonalBasis, completed
from ._runs import check_pairs, chunks, inputs, intervened, record
from .bases import check_basis
from .controls import untrained_copy
from .interchange import SubspaceInterchange, interchange
from .pairs import PairSet, arbitrary_labels
from .sites import Site, as_site

__all__ = ["DASOptions", "DASFit", "DAS", "das", "CONTROLS"]

#: The training losses of :class:`DASOptions`.
LOSSES = ("cross_entropy", "squared")
#: The learning-rate schedules of :class:`DASOptions`.
SCHEDULES = ("constant", "linear", "cosine")
#: The controls :func:`das` can train, by name.
CONTROLS = ("arbitrary labels", "untrained model")


@dataclass(frozen=True)
class DASOptions:
    """How DAS trains (TransformerLens 4.3's ``fit_das`` arguments, its defaults but ``batch_size``).

    Attributes:
        rank: the subspace's dimension, in ``[1, width]`` (checked against the site).
        epochs: passes over the pairs.
        batch_size: pairs per optimisation step (64, rs_interp's batch; TransformerLens's default is 128).
        lr: Adam's learning rate.
        strength: the interchange's strength while training.
        seed: the initial basis and the batch order.
        micro_batch_size: pairs per forward pass (a batch split, the same gradient); None: the whole batch.
        loss: ``"cross_entropy"`` of the class scores (TransformerLens's), or ``"squared"``: the squared error of
            the read output to the label's, for a model whose outputs are exact (tracr's). Cross-entropy keeps
            rewarding a larger margin, which a subspace can buy by mixing in directions that differ with the
            label (a variable's parents): there it misses the variable (docs/capabilities/variables.md).
        schedule: the learning rate over the steps: ``"constant"`` (TransformerLens's), or decayed to 0 at the
            last step, ``"linear"`` or ``"cosine"``. Adam's steps are normalised, so near an exact answer the
            smallest gradient moves the basis by about ``lr``: on a model as sharp as tracr's (softmax
            coldness in the hundreds) a constant rate walks off the answer it found; a decay lets it settle.
        restarts: how many starts to train (seeds ``seed``, ``seed + 1``, ...), keeping the one whose mean loss
            over the training pairs (never the held-out pairs), once trained, is least; the controls' too.
        temper: the scale of every later attention's queries at the first step (in ``(0, 1]``; 1: none),
            raised geometrically to 1 by ``temper_until`` of the steps and 1 after: cold attention (tracr's)
            has a loss flat away from the answer and a cliff next to it; softened, its gradients reach further
            (the accuracies are of the untouched model).
        temper_until: the fraction of the steps over which ``temper`` anneals to 1, in ``(0, 1]``.

    Raises:
        ValueError: a rank, epoch count, batch size or restart count below 1, a learning rate that is not
            positive, an unknown loss or schedule, a ``temper`` or ``temper_until`` outside ``(0, 1]``.
    """

    rank: int
    epochs: int = 20
    batch_size: int = 64
    lr: float = 1e-2
    strength: float = 1.0
    seed: int = 0
    micro_batch_size: int | None = None
    loss: Literal["cross_entropy", "squared"] = "cross_entropy"
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    restarts: int = 1
    temper: float = 1.0
    temper_until: float = 0.75

    def __post_init__(self) -> None:
        counts = ("rank", "epochs", "batch_size", "restarts") + (("micro_batch_size",) if self.micro_batch_size else ())
        for name in counts:
            object.__setattr__(self, name, check_int_range(name, getattr(self, name), 1))
        object.__setattr__(self, "seed", as_int("seed", self.seed))
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                             and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("temper", "temper_until"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")


@dataclass(frozen=True)
class DASFit:
    """One trained subspace.

    Attributes:
        basis: (width, rank) the learned orthonormal basis.
        losses: the mean training loss of each optimisation step.
        train_accuracy: its interchange accuracy on the training pairs.
        accuracy: its interchange accuracy on the held-out pairs.
        restart: which start was kept (``DASOptions.restarts``; 0: the first, from ``init`` where given).
    """

    basis: Float[torch.Tensor, "width rank"]
    losses: tuple[float, ...]
    train_accuracy: float
    accuracy: float
    restart: int = 0


@dataclass(frozen=True)
class DAS:
    """A subspace learned by :func:`das`, beside its controls.

    Attributes:
        fit: the model's :class:`DASFit`.
        controls: each control's :class:`DASFit`, by name (:data:`CONTROLS`).
        null_accuracy: the held-out accuracy of no intervention (the model alone).
        site: where it was trained.
        options: how (:class:`DASOptions`).
        n_pairs: the number of training pairs.
    """

    fit: DASFit
    controls: Mapping[str, DASFit]
    null_accuracy: float
    site: Site
    options: DASOptions
    n_pairs: int

    @property
    def steps_per_epoch(self) -> int:
        """Optimisation steps per pass over the pairs."""
        return math.ceil(self.n_pairs / self.options.batch_size)

    @property
    def basis(self) -> Float[torch.Tensor, "width rank"]:
        return self.fit.basis

    @property
    def accuracy(self) -> float:
        return self.fit.accuracy

    @property
    def losses(self) -> tuple[float, ...]:
        return self.fit.losses

    def epoch_losses(self) -> tuple[float, ...]:
        """The mean loss over the pairs of each epoch (TransformerLens's ``DASResult.losses``)."""
        k, size = self.steps_per_epoch, self.options.batch_size
        sizes = [min(size, self.n_pairs - i * size) for i in range(k)]
        return tuple(sum(loss * n for loss, n in zip(self.losses[i:i + k], sizes)) / self.n_pairs
                     for i in range(0, len(self.losses), k))

    def table(self) -> str:
        """The held-out accuracies side by side: the model, each control, no intervention.

        >>> import rs_interp as ri
        >>> from rs_interp.variables import DASOptions, das, tracr_pairs, tracr_variables
        >>> var = tracr_variables("tracr-hist")["hist_1"]
        >>> train, test = tracr_pairs("tracr-hist", "hist_1", n=24, seed=0).split(0.25)
        >>> fit = das(ri.load_toy_model("tracr-hist"), train, var.site, DASOptions(rank=4, epochs=1), test=test,
        ...           progress=False)
        >>> print(fit.table().splitlines()[0])
        DAS at blocks.0.hook_resid_post, rank 4: held-out interchange accuracy
        """
        rows = [("trained model", self.fit)] + list(self.controls.items())
        lines = [f"DAS at {self.site.hook}" + (f" head {self.site.head}" if self.site.head is not None else "")
                 + f", rank {self.options.rank}: held-out interchange accuracy"]
        lines += [f"  {name:<16} {fit.accuracy:6.3f}   (train {fit.train_accuracy:.3f})" for name, fit in rows]
        lines.append(f"  {'no intervention':<16} {self.null_accuracy:6.3f}")
        return "\n".join(lines)


def _source_activations(model: Model, pairs: PairSet, site: Site, batch: int) -> list[torch.Tensor]:
    """Each row's source activation at the site (recorded once, before training)."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(pairs)
    with torch.no_grad():
        for rows in chunks(pairs, batch):
            for i, act in zip(rows.tolist(), record(model, site, *inputs(pairs, rows, "source"))):
                out[i] = act
    return out


def _loss(model: Model, pairs: PairSet, site: Site, swap: "_Swap", rows: torch.Tensor, acts: list[torch.Tensor],
          denominator: int, kind: str) -> torch.Tensor:
    tokens, at = inputs(pairs, rows, "base")
    source = torch.stack([acts[i] for i in rows.tolist()])
    logits = intervened(model, site, swap, tokens, at, source)
    target = pairs.labels[rows].to(logits.device)
    if kind == "squared":
        return _squared(pairs, logits, rows, target).sum() / denominator
    return F.cross_entropy(pairs.task_logits(logits, rows), target, reduction="sum") / denominator


def _squared(pairs: PairSet, logits: torch.Tensor, rows: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the squared distance of the read output to the label's exact output: the one-hot of the label
    over the row's candidates' logits, or (numerical) the label's value."""
    at = logits[torch.arange(len(rows), device=logits.device), pairs.read[rows].to(logits.device)]
    if pairs.values is not None:
        return (at[:, 0] - pairs.values.to(at.device, at.dtype)[target]) ** 2
    cand = pairs.candidates[rows].to(at.device)
    picked = at.gather(1, cand.clamp(min=0))
    want = F.one_hot(target, cand.shape[1]).to(picked.dtype)
    return ((picked - want) ** 2).masked_fill(cand < 0, 0.0).sum(1)


class _Swap:
    """The interchange with the trainable basis (read at every call, so gradients reach its parameter)."""

    def __init__(self, subspace: Callable[[], torch.Tensor], strength: float) -> None:
        self.subspace, self.strength = subspace, strength

    def __call__(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        B = self.subspace().to(base.device, base.dtype)
        return base + self.strength * ((source - base) @ B) @ B.T


def _train(model: Model, pairs: PairSet, site: Site, options: DASOptions, base: torch.Tensor, progress: bool,
           what: str) -> tuple[torch.Tensor, tuple[float, ...]]:
    """The learned basis and the loss of each step (module docstring)."""
    micro = options.micro_batch_size or options.batch_size
    acts = _source_activations(model, pairs, site, micro)
    subspace = OrthogonalBasis(base, options.rank)
    optimizer = torch.optim.Adam(subspace.parameters(), lr=options.lr)
    swap, rng, losses = _Swap(subspace, options.strength), np.random.default_rng(options.seed), []
    flags = [p.requires_grad for p in model.parameters()]
    steps = options.epochs * math.ceil(len(pairs) / options.batch_size)
    rates = _rates(options, steps)
    model.requires_grad_(False)
    try:
        with torch.enable_grad(), bar(total=steps, desc=f"DAS ({what})", enabled=progress) as progress_bar:
            for _ in range(options.epochs):
                order = torch.as_tensor(rng.permutation(len(pairs)))
                for start in range(0, len(order), options.batch_size):
                    batch = order[start:start + options.batch_size]
                    if rates is not None:
                        optimizer.param_groups[0]["lr"] = rates[len(losses)]
                    optimizer.zero_grad()
                    total = 0.0
                    with model.hooks(fwd_hooks=_tempered(model, site, options, len(losses) / steps)):
                        for rows in _parts(pairs, batch, micro):
                            loss = _loss(model, pairs, site, swap, rows, acts, len(batch), options.loss)
                            loss.backward()
                            total += loss.item() * len(batch)
                    optimizer.step()
                    losses.append(total / len(batch))
                    progress_bar.update(1)
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    with torch.no_grad():
        return subspace().detach(), tuple(losses)


def _rates(options: DASOptions, steps: int) -> list[float] | None:
    """Each step's learning rate (None: ``lr`` throughout, the optimizer left as TransformerLens leaves it)."""
    if options.schedule == "constant":
        return None
    if options.schedule == "linear":
        return [options.lr * (1 - k / steps) for k in range(steps)]
    return [options.lr * 0.5 * (1 + math.cos(math.pi * k / steps)) for k in range(steps)]


def _tempered(model: Model, site: Site, options: DASOptions, done: float) -> list:
    """The hooks scaling the queries of every attention after the site by the temperature at ``done`` (the
    fraction of the steps taken): ``temper`` raised geometrically to 1 by ``temper_until``; none at 1."""
    scale = options.temper ** max(0.0, 1.0 - done / options.temper_until)
    if scale == 1.0:
        return []
    # q, not hook_attn_scores (TL 4.3 fires it too late on native attention): scaling q scales the scores, masked after
    first = site.layer + (0 if site.hook.endswith("hook_resid_pre") else 1)
    names = [f"blocks.{layer}.attn.hook_q" for layer in range(first, model.cfg.n_layers)]
    missing = [name for name in names if name not in model.hook_dict]
    if missing:
        raise ValueError(f"temper scales the queries of every later attention, but the model lacks {few(missing)}")
    return [(name, lambda q, hook: q * scale) for name in names]


def _final_loss(model: Model, pairs: PairSet, site: Site, basis: torch.Tensor, options: DASOptions) -> float:
    """The mean training loss of a learned basis over every training pair (how restarts are compared)."""
    micro = options.micro_batch_size or options.batch_size
    acts, swap = _source_activations(model, pairs, site, micro), _Swap(lambda: basis, options.strength)
    with torch.no_grad():
        return sum(float(_loss(model, pairs, site, swap, rows, acts, len(pairs), options.loss))
                   for rows in chunks(pairs, micro))


def _parts(pairs: PairSet, batch: torch.Tensor, micro: int) -> list[torch.Tensor]:
    """A batch's rows split by length (one forward pass each), then into ``micro``-row parts, order kept."""
    lengths = list(zip(pairs.lengths("base")[batch].tolist(), pairs.lengths("source")[batch].tolist()))
    groups: dict[tuple[int, int], list[int]] = {}
    for row, key in zip(batch.tolist(), lengths):
        groups.setdefault(key, []).append(row)
    return [torch.tensor(rows[i:i + micro]) for rows in groups.values() for i in range(0, len(rows), micro)]


def _fit(model: Model, train: PairSet, test: PairSet, site: Site, options: DASOptions, base: torch.Tensor,
         progress: bool, what: str) -> DASFit:
    """Train from each start (``options.restarts``), keep the least final training loss, score it."""
    runs = []
    for r in range(options.restarts):
        start = base if r == 0 else completed(None, base.shape[0], options.rank,
                                              torch.Generator().manual_seed(options.seed + r))
        basis, losses = _train(model, train, site, replace(options, seed=options.seed + r), start, progress, what)
        final = _final_loss(model, train, site, basis, options) if options.restarts > 1 else 0.0
        runs.append((final, r, basis, losses))
    _, restart, basis, losses = min(runs, key=lambda run: (run[0], run[1]))
    swap = SubspaceInterchange(basis)
    return DASFit(basis=basis, losses=losses,
                  train_accuracy=interchange(model, train, site, swap, progress=False).accuracy,
                  accuracy=interchange(model, test, site, swap, progress=False).accuracy, restart=restart)


@needs("rows", "gradients", name="variables.das", optional=SITES)
def das(model: Model, pairs: PairSet, site: Site | str | tuple[str, int], options: DASOptions, *, test: PairSet,
        controls: Sequence[str] = CONTROLS, init: torch.Tensor | None = None, progress: bool = True) -> DAS:
    """Learn the rank-``options.rank`` subspace at ``site`` whose interchange gives ``pairs``' labels, and
    train the ``controls`` the same way (module docstring); every accuracy is measured on ``test``.

    Args:
        model: any ``Model`` whose certificate vouches for the site (and its gradients).
        pairs: the training pairs (both kinds: only the aligned variable differing, and several).
        site: a :class:`~rs_interp.variables.Site`, a hook point's name, or ``(hook_z's name, head)``.
        options: :class:`DASOptions` (the rank, epochs, batch, learning rate, seed).
        test: held-out pairs (``pairs.split()`` makes both).
        controls: which of :data:`CONTROLS` to train too (none: ``()``).
        init: the initial basis: (width, rank) orthonormal, or (width, width) orthogonal (the first ``rank``
            columns are the start, the rest its completion: TransformerLens's ``base``, to start where it
            does); None: drawn from ``options.seed``.
        progress: a progress bar over the optimisation steps (after 2 s).

    Returns:
        A :class:`DAS`.

    Raises:
        ValueError: a site the model lacks or its certificate does not vouch for, a rank above the site's
            width, pair sets the model cannot run, an unknown control, an ``init`` that is not orthonormal.
    """
    site = as_site(site, model)
    require(model, "variables.das", also=site.identities)
    width = site.width(model)
    if options.rank > width:
        raise ValueError(f"rank {options.rank} is above the width of {site.hook}'s activation ({width})")
    unknown = [c for c in controls if c not in CONTROLS]
    if unknown:
        raise ValueError(f"unknown controls {few(unknown)}: choose among {CONTROLS}")
    for p in (pairs, test):
        check_pairs(model, p)
    base = completed(_checked_init(init, width, options.rank), width, options.rank,
                     torch.Generator().manual_seed(options.seed))
    with preserve_state(model):
        fit = _fit(model, pairs, test, site, options, base, progress, "trained model")
    fits = {name: _control(model, name, pairs, test, site, options, base, progress) for name in controls}
    return DAS(fit=fit, controls=fits, null_accuracy=_null(model, test, site), site=site, options=options,
               n_pairs=len(pairs))


def _null(model: Model, test: PairSet, site: Site) -> float:
    swap = SubspaceInterchange(torch.eye(site.width(model), 1), strength=0.0)
    return interchange(model, test, site, swap, progress=False).null_accuracy


def _control(model: Model, name: str, train: PairSet, test: PairSet, site: Site, options: DASOptions,
             base: torch.Tensor, progress: bool) -> DASFit:
    if name == "arbitrary labels":
        train = train.with_labels(arbitrary_labels(train, seed=options.seed))
        test = test.with_labels(arbitrary_labels(test, seed=options.seed))
    else:
        model = untrained_copy(model, seed=options.seed)
        require(model, "variables.das", also=site.identities)
    with preserve_state(model):
        return _fit(model, train, test, site, options, base, progress, name)


def _checked_init(init: torch.Tensor | None, width: int, rank: int) -> torch.Tensor | None:
    if init is None:
        return None
    check_basis(init, width, name="init")
    if init.shape[1] not in (rank, width):
        raise ValueError(f"init must have {rank} columns (the rank) or {width} (a full orthogonal base), "
                         f"got {init.shape[1]}")
    return init
