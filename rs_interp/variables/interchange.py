"""Interchange interventions on a linear subspace, their placebo, and what they do to the model's choice.

On each pair of a :class:`~rs_interp.variables.PairSet` the model runs on the base while its activation
``h`` at the site (at one position per pair, or every position) is moved inside the span of an
orthonormal basis ``B`` towards the source's ``h_s``:

    h' = h + s (h_s - h) B B^T

(``s = 1``: the base's coordinates inside the subspace are the source's, those outside its own; the
expression and its order of operations are TransformerLens 4.3's ``SubspaceInterchange``, so both give
the same floats). The norm-matched placebo moves each base exactly as far, but inside another
subspace (a random one, :func:`~rs_interp.variables.random_basis`): an effect the placebo also has comes
from moving the activation that far, not from the subspace.

The model's choice among the row's classes is then compared with the high-level model's counterfactual
label: the **interchange accuracy** is the fraction of rows where the intervened model's top class is
the label; the **null accuracy** the same for the model left alone (the accuracy of doing nothing: an
intervention with no effect scores it, chance for this pair set); the **effect** of a row is the change of
``logit[label] - logit[base label]`` the intervention makes.

>>> import rs_interp as ri
>>> from rs_interp.variables import interchange, neuron_basis, tracr_pairs, tracr_variables
>>> model = ri.load_toy_model("tracr-hist")
>>> var = tracr_variables("tracr-hist")["hist_1"]
>>> pairs = tracr_pairs("tracr-hist", "hist_1", n=16, seed=0)
>>> result = interchange(model, pairs, var.site, neuron_basis(model.cfg.d_model, var.dims))
>>> result.accuracy, result.null_accuracy < 1.0
(1.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int

from .._backend import Model
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import SITES, needs
from ..exact.validate import check_int_range
from ._runs import Intervention, check_pairs, chunks, inputs, intervened, record
from .bases import check_basis
from .pairs import PairSet
from .sites import Site, as_site

__all__ = ["SubspaceInterchange", "NormMatchedPlacebo", "Interchange", "interchange", "activations"]


@dataclass(frozen=True)
class SubspaceInterchange:
    """``h + strength * ((h_s - h) @ B) @ B.T``: the base's coordinates in ``basis``'s span set to the source's.

    Attributes:
        basis: orthonormal (width, rank) basis (checked).
        strength: 1 interchanges; 0 leaves the base; other values scale the move.

    >>> from rs_interp.variables import neuron_basis
    >>> swap = SubspaceInterchange(neuron_basis(3, [1]))
    >>> swap(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[7.0, 8.0, 9.0]])).tolist()
    [[1.0, 8.0, 3.0]]
    """

    basis: Float[torch.Tensor, "width rank"]
    strength: float = 1.0

    def __post_init__(self) -> None:
        check_basis(self.basis)

    def __call__(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        B = self.basis.to(base.device, base.dtype)
        return base + self.strength * ((source - base) @ B) @ B.T


@dataclass(frozen=True)
class NormMatchedPlacebo:
    """Moves each base as far as ``reference`` does, but inside ``basis``'s span (TransformerLens 4.3's
    ``NormMatchedPlacebo``): ``h + m |reference(h, h_s) - h| / |m|``, ``m = ((h_s - h) @ B) @ B.T``.

    Attributes:
        reference: the interchange whose displacement is matched.
        basis: the placebo's orthonormal basis, usually ``random_basis`` of the reference's rank (or
            ``random_neuron_basis`` for a reference on neurons).
    """

    reference: SubspaceInterchange
    basis: Float[torch.Tensor, "width rank"]

    def __post_init__(self) -> None:
        check_basis(self.basis, self.reference.basis.shape[0], name="placebo basis")

    def __call__(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        distance = (self.reference(base, source) - base).norm(dim=-1, keepdim=True)
        B = self.basis.to(base.device, base.dtype)
        move = ((source - base) @ B) @ B.T
        return base + move * (distance / move.norm(dim=-1, keepdim=True).clamp_min(1e-8))


@dataclass(frozen=True)
class Interchange:
    """The model's class scores on a pair set, intervened and left alone (module docstring).

    Attributes:
        logits: (batch, k) the class scores under the intervention (``-inf`` on a row's padding).
        base_logits: (batch, k) the class scores of the bases, no intervention.
        labels: (batch,) the high-level model's counterfactual classes.
        base_labels: (batch,) its classes for the bases alone.
        site: where it intervened.
        variable: the aligned variable's name.
    """

    logits: Float[torch.Tensor, "batch k"]
    base_logits: Float[torch.Tensor, "batch k"]
    labels: Int[torch.Tensor, " batch"]
    base_labels: Int[torch.Tensor, " batch"]
    site: Site
    variable: str = ""

    @property
    def correct(self) -> Bool[torch.Tensor, " batch"]:
        """Where the intervened model's top class is the counterfactual label."""
        return self.logits.argmax(-1) == self.labels

    @property
    def accuracy(self) -> float:
        """The interchange accuracy: the fraction of rows :attr:`correct`."""
        return float(self.correct.double().mean())

    @property
    def null_accuracy(self) -> float:
        """The accuracy of no intervention: the fraction of rows whose base's own top class is the label."""
        return float((self.base_logits.argmax(-1) == self.labels).double().mean())

    @property
    def base_accuracy(self) -> float:
        """How often the model alone gives the high-level model's class for the base."""
        return float((self.base_logits.argmax(-1) == self.base_labels).double().mean())

    @property
    def effect(self) -> Float[torch.Tensor, " batch"]:
        """Per row, the change of ``logit[label] - logit[base label]`` the intervention makes (0 where they
        coincide)."""
        def diff(x: torch.Tensor) -> torch.Tensor:
            return x.gather(1, self.labels[:, None])[:, 0] - x.gather(1, self.base_labels[:, None])[:, 0]
        return diff(self.logits) - diff(self.base_logits)

    def mean_effect(self) -> float:
        """The mean :attr:`effect` over the rows whose label differs from their base label.

        Raises:
            ValueError: no row's label differs from its base's (no effect is expected anywhere).
        """
        moved = self.labels != self.base_labels
        if not bool(moved.any()):
            raise ValueError("no pair's counterfactual label differs from its base label: the effect is not defined")
        return float(self.effect[moved].double().mean())


def _intervention(intervention: object, width: int) -> Intervention:
    if isinstance(intervention, torch.Tensor):
        intervention = SubspaceInterchange(intervention)
    if isinstance(intervention, SubspaceInterchange):
        check_basis(intervention.basis, width)
    elif isinstance(intervention, NormMatchedPlacebo):
        check_basis(intervention.basis, width, name="placebo basis")
    elif not callable(intervention):
        raise ValueError("intervention must be a basis tensor, a SubspaceInterchange, a NormMatchedPlacebo or a "
                         f"callable (base, source) -> new base, got {type(intervention).__name__}")
    return intervention  # type: ignore[return-value]


@needs("rows", name="variables.interchange", optional=SITES)
def interchange(model: Model, pairs: PairSet, site: Site | str | tuple[str, int],
                intervention: Float[torch.Tensor, "width rank"] | SubspaceInterchange | NormMatchedPlacebo, *,
                batch_size: int = 64, progress: bool = True) -> Interchange:
    """Run every pair of ``pairs`` with ``intervention`` at ``site`` (module docstring).

    Args:
        model: any ``Model`` whose certificate vouches for the site (:mod:`rs_interp.variables.sites`).
        pairs: the pairs and their labels (:class:`~rs_interp.variables.PairSet`).
        site: a :class:`~rs_interp.variables.Site`, a hook point's name, or ``(hook_z's name, head)``.
        intervention: an orthonormal basis (interchanged at strength 1), a :class:`SubspaceInterchange`,
            a :class:`NormMatchedPlacebo`, or any ``(base, source) -> new base`` callable.
        batch_size: pairs per forward pass (rows of one length share a pass).
        progress: a progress bar over the batches (after 2 s).

    Returns:
        An :class:`Interchange`.

    Raises:
        ValueError: a hook point the model lacks or its certificate does not vouch for, a basis that is not
            orthonormal or not as wide as the site's activation, a pair set the model cannot run.
    """
    site = as_site(site, model)
    require(model, "variables.interchange", also=site.identities)
    fn = _intervention(intervention, site.width(model))
    check_pairs(model, pairs)
    batch_size = check_int_range("batch_size", batch_size, 1)
    dtype = torch.float64 if model.cfg.dtype == torch.float64 else torch.float32
    logits, base_logits = _empty(pairs, dtype), _empty(pairs, dtype)
    with preserve_state(model), torch.no_grad():
        batches = list(chunks(pairs, batch_size))
        for rows in bar(batches, desc="interchange", enabled=progress):
            tokens, at = inputs(pairs, rows, "base")
            source = record(model, site, *inputs(pairs, rows, "source"))
            logits[rows] = pairs.task_logits(intervened(model, site, fn, tokens, at, source), rows).to(dtype).cpu()
            base_logits[rows] = pairs.task_logits(model(tokens), rows).to(dtype).cpu()
    return Interchange(logits=logits, base_logits=base_logits, labels=pairs.labels, base_labels=pairs.base_labels,
                       site=site, variable=pairs.variable)


@needs("rows", name="variables.activations", optional=SITES)
def activations(model: Model, tokens: Int[torch.Tensor, "batch pos"], site: Site | str | tuple[str, int], *,
                at: Int[torch.Tensor, " batch"] | None = None, batch_size: int = 64
                ) -> Float[torch.Tensor, "batch ..."]:
    """The activation at ``site`` (its view: a head's ``z``, the stream, the neurons) on ``tokens``, at one
    position per row (``at``: (batch, width)) or every position ((batch, pos, width)), on the CPU: what
    :func:`~rs_interp.variables.mean_difference_basis` and a probe are fit on.

    Raises:
        ValueError: a site the model lacks or its certificate does not vouch for, ``at`` of another shape.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> tuple(activations(model, ri.induction_batch(3, seed=0).tokens, ("blocks.0.attn.hook_z", 0)).shape)
    (3, 48, 16)
    """
    site = as_site(site, model)
    require(model, "variables.activations", also=site.identities)
    tokens = torch.as_tensor(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be (batch, pos), got shape {tuple(tokens.shape)}")
    if at is not None and torch.as_tensor(at).shape != (tokens.shape[0],):
        raise ValueError(f"at must hold one position per row, shape ({tokens.shape[0]},)")
    step = check_int_range("batch_size", batch_size, 1)
    out = []
    with preserve_state(model), torch.no_grad():
        for start in range(0, tokens.shape[0], step):
            rows = None if at is None else torch.as_tensor(at)[start:start + step]
            out.append(record(model, site, tokens[start:start + step], rows).cpu())
    return torch.cat(out)


def _empty(pairs: PairSet, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(len(pairs), pairs.n_classes, dtype=dtype)
