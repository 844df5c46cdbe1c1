"""How much of an activation J-space holds (Gurnee et al. 2026): the *occupancy* (how many J-lens vectors are
meaningfully active, against random dictionaries of the same size) and the *fraction of variance* in J-space over a
corpus, both on the decomposition of :mod:`rs_interp.readouts.jspace` (TransformerLens 4.3's ``estimate_occupancy``
and ``JacobianLens.fraction_of_variance``).

>>> occ = estimate_occupancy(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.eye(4), max_atoms=3, controls=4)
>>> occ.occupancy
2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model
from .._progress import bar
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import needs
from ..exact.readout import compute_dtype
from ..exact.stream import record
from ..exact.validate import check_int_range, check_tokens
from .jacobian_lens import SKIP_FIRST, JacobianLens
from .jspace import (
    DEFAULT_K,
    activation_at,
    check_inputs,
    dictionary,
    layer_index,
    project,
    select_atom,
    sparse_decomposition,
)

__all__ = ["JSpaceOccupancy", "estimate_occupancy", "jspace_occupancy", "JSpaceVariance", "jspace_variance"]


# --- occupancy ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JSpaceOccupancy:
    """How many dictionary atoms are meaningfully active in an activation (:func:`estimate_occupancy`).

    Attributes:
        occupancy: the step where the real greedy selection's captured variance is furthest above the random
            controls' (cumulatively).
        marginal_captured_variance: (max_atoms,) each step's gain of ``||proj_S x||^2 / ||x||^2``, real atoms.
        control_captured_variance: (max_atoms,) the same, averaged over random unit dictionaries of the same size.
        support: (max_atoms,) the atoms selected, in order.

    >>> occ = estimate_occupancy(torch.tensor([2.0, 1.0, 0.0]), torch.eye(3), max_atoms=2, controls=2)
    >>> occ.top(2)
    [(0, 0.8), (1, 0.2)]
    """

    occupancy: int
    marginal_captured_variance: torch.Tensor
    control_captured_variance: torch.Tensor
    support: torch.Tensor

    def top(self, k: int = 5) -> list[tuple[int, float]]:
        """The first ``k`` atoms selected with the variance each captured."""
        k = check_int_range("k", k, 1)
        return [(int(a), round(float(v), 4)) for a, v in zip(self.support[:k], self.marginal_captured_variance[:k])]


def _captured(D: torch.Tensor, norms: torch.Tensor, x: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly ``steps`` greedy selections (the decomposition's correlation rule), each followed by the projection of
    ``x`` onto the span selected: the gains in captured variance and the atoms."""
    total = float(x @ x)
    chosen: list[int] = []
    residual, gains, before = x.clone(), [], 0.0
    for _ in range(steps):
        chosen.append(select_atom(D, norms, residual, chosen)[0])
        proj = project(D[chosen].T, x)
        now = float(proj @ proj) / total
        gains.append(now - before)
        before, residual = now, x - proj
    return torch.tensor(gains, dtype=torch.float64), torch.tensor(chosen, dtype=torch.long)


def estimate_occupancy(x: Float[torch.Tensor, " d_model"], dictionary: Float[torch.Tensor, "atoms d_model"], *,
                       max_atoms: int = DEFAULT_K, controls: int = 32, seed: int = 0) -> JSpaceOccupancy:
    """How many atoms of ``dictionary`` are meaningfully active in ``x``: the greedy captured-variance curve against
    the same on ``controls`` random unit dictionaries of the same size (drawn on the CPU from ``seed``); the
    occupancy is the step of largest cumulative separation (TransformerLens 4.3's ``estimate_occupancy``).

    >>> occ = estimate_occupancy(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.eye(4), max_atoms=3, controls=4)
    >>> occ.occupancy, sorted(occ.support[:2].tolist())
    (2, [0, 1])
    """
    x, D = check_inputs(x, dictionary)
    max_atoms = check_int_range("max_atoms", max_atoms, 1, D.shape[0])
    controls = check_int_range("controls", controls, 1)
    if float(x @ x) <= 0:
        raise ValueError("the activation has norm zero: nothing to occupy")
    real, support = _captured(D, D.norm(dim=1), x, max_atoms)
    g = torch.Generator(device="cpu").manual_seed(seed)
    ones = torch.ones(D.shape[0], dtype=D.dtype)
    runs = []
    for _ in range(controls):
        R = torch.randn(D.shape, generator=g, dtype=D.dtype)
        runs.append(_captured(R / R.norm(dim=1, keepdim=True), ones, x, max_atoms)[0])
    control = torch.stack(runs).mean(0)
    occupancy = int((real.cumsum(0) - control.cumsum(0)).argmax()) + 1
    return JSpaceOccupancy(occupancy, real, control, support)


@needs("readout", "vocabulary")
def jspace_occupancy(
    model: Model,
    lens: JacobianLens,
    activation: torch.Tensor,
    layer: int,
    *,
    position: int | None = None,
    max_atoms: int = DEFAULT_K,
    controls: int = 32,
    seed: int = 0,
) -> JSpaceOccupancy:
    """:func:`estimate_occupancy` of an activation at ``layer`` over the vocabulary's J-lens vectors (the activation as
    :func:`rs_interp.jspace_decomposition` reads it; ``controls`` random dictionaries of the vocabulary's size).

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(2, seed=0).tokens
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> 1 <= ri.jspace_occupancy(model, lens, toks[0], 0, position=-1, max_atoms=4, controls=2).occupancy <= 4
    True
    """
    require(model, "jspace_occupancy")
    x = activation_at(model, activation, layer, position, "jspace_occupancy")
    return estimate_occupancy(x, dictionary(model, lens, layer, "jspace_occupancy"), max_atoms=max_atoms,
                              controls=controls, seed=seed)


# --- the fraction of variance ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class JSpaceVariance:
    """The share of the stream's variance in J-space, per layer, over a corpus (:func:`jspace_variance`).

    Attributes:
        layers: the source layers profiled.
        median: per layer, the median over positions of ``||j_space_component||^2 / ||x||^2``.
        pooled: per layer, ``sum ||j_space_component||^2 / sum ||x||^2`` (the paper's fraction of total variance).
        per_position: per layer, every position's fraction.

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(1, seed=0).tokens[:, :10]
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> profile = jspace_variance(model, lens, toks, k=3, skip_first=6, progress=False)
    >>> profile.layers, len(profile.per_position[0])
    ((0,), 4)
    """

    layers: tuple[int, ...]
    median: dict[int, float]
    pooled: dict[int, float]
    per_position: dict[int, torch.Tensor]


@needs("readout", "vocabulary")
def jspace_variance(
    model: Model,
    lens: JacobianLens,
    prompts: Int[torch.Tensor, "batch pos"] | Sequence[torch.Tensor],
    layers: Sequence[int] | None = None,
    *,
    k: int = DEFAULT_K,
    skip_first: int = SKIP_FIRST,
    progress: bool = True,
) -> JSpaceVariance:
    """The fraction of the stream's variance in J-space at each layer: every position past ``skip_first`` of every
    prompt decomposed (``"omp"``, ``k`` atoms), its J-space component's share of its squared norm (a position of
    norm zero counts nowhere; a layer with no position has NaN).

    >>> import rs_interp as ri
    >>> model = ri.load_toy_model("induction-2l")
    >>> toks = ri.induction_batch(2, seed=0).tokens
    >>> lens = ri.fit_jacobian_lens(model, toks, skip_first=4, progress=False)
    >>> 0 <= ri.jspace_variance(model, lens, toks[:1, :8], k=3, skip_first=4, progress=False).pooled[0] <= 1
    True
    """
    require(model, "jspace_variance")
    layers = tuple(lens.source_layers if layers is None else layers)
    for layer in layers:
        layer_index(lens, layer, "jspace_variance")
    skip_first = check_int_range("skip_first", skip_first, 0)
    rows = [check_tokens(model, p) for p in ([prompts] if isinstance(prompts, torch.Tensor) else prompts)]
    rows = [r[i: i + 1] for r in rows for i in range(r.shape[0])]
    if not rows:
        raise ValueError("jspace_variance needs at least one prompt")
    dicts = {layer: dictionary(model, lens, layer, "jspace_variance") for layer in layers}
    fractions: dict[int, list[float]] = {layer: [] for layer in layers}
    num, den = dict.fromkeys(layers, 0.0), dict.fromkeys(layers, 0.0)
    names = {N.resid_post(layer) for layer in layers}
    for tokens in bar(rows, desc="J-space variance", enabled=progress, unit="prompt"):
        with preserve_state(model):
            box = record(model, tokens, lambda name: name in names)
        for layer in layers:
            for x in box[N.resid_post(layer)][0, skip_first:].to(compute_dtype(model)):
                total = float(x @ x)
                if total <= 0.0:
                    continue
                j = sparse_decomposition(x, dicts[layer], k).j_space_component
                fractions[layer].append(float(j @ j) / total)
                num[layer] += float(j @ j)
                den[layer] += total
    nan = float("nan")
    return JSpaceVariance(layers=layers,
                          median={l: float(torch.tensor(f, dtype=torch.float64).median()) if f else nan
                                  for l, f in fractions.items()},
                          pooled={l: num[l] / den[l] if den[l] > 0 else nan for l in layers},
                          per_position={l: torch.tensor(f, dtype=torch.float64) for l, f in fractions.items()})
