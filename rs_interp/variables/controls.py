"""The controls a learned subspace is compared with: the same method on an untrained copy of the model, and
on arbitrary labels (:func:`rs_interp.variables.arbitrary_labels`).

DAS fits arbitrary label mappings and finds effects in randomly initialised models (Arora et al., 2024):
an interchange accuracy alone is not evidence that the model holds the variable. :func:`untrained_copy`
gives the model's architecture with weights drawn afresh, GPT-2's initialisation (TransformerLens's
``init_mode="gpt2"``: every weight matrix ``N(0, initializer_range^2)``, biases 0, norm gains 1), by its own
generator: the global random state is never read or moved.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> copy = untrained_copy(model, seed=0)
>>> bool(torch.equal(copy.W_Q, model.W_Q)), copy.cfg.n_layers == model.cfg.n_layers
(False, True)
"""

from __future__ import annotations

import copy as _copy

import torch

from .. import _backend
from .._backend import Model
from ..exact.validate import as_int

__all__ = ["untrained_copy"]

#: The standard deviation where the config gives none (GPT-2's).
DEFAULT_STD = 0.02


def untrained_copy(model: Model, *, seed: int = 0) -> Model:
    """A copy of ``model`` with every weight drawn again (module docstring), in evaluation mode; ``model``
    is not changed (the copy holds no hooks it did not have).

    Raises:
        ValueError: a model whose weights cannot be read in TransformerLens's names.
    """
    g = torch.Generator().manual_seed(as_int("seed", seed))
    std = float(getattr(model.cfg, "initializer_range", 0) or 0) or DEFAULT_STD
    clone = _copy.deepcopy(model)
    state = _backend.portable_state(clone)
    for name, p in sorted(state.items()):  # sorted: the same draws on both TransformerLens versions
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "w":
            state[name] = torch.ones_like(p)
        elif leaf.startswith("b"):
            state[name] = torch.zeros_like(p)
        else:
            state[name] = (std * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(p.dtype)
    _backend.load_portable_state(clone, state)
    return clone.eval()
