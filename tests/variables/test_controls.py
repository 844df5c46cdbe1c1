"""The untrained copy: the architecture with every weight drawn afresh (GPT-2's initialisation, its own
generator), the model itself unchanged, the same copy from the same seed, the global random state untouched."""

from __future__ import annotations

import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.variables import untrained_copy
from tests.builders import make_variant


def test_an_untrained_copy_is_drawn_afresh_and_leaves_the_model():
    model = make_variant("LN", "rotary", False, "gqa")
    before = {k: v.clone() for k, v in _backend.portable_state(model).items()}
    state = torch.get_rng_state()
    a, b = untrained_copy(model, seed=1), untrained_copy(model, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    after, copy = _backend.portable_state(model), _backend.portable_state(a)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(v, _backend.portable_state(b)[k]) for k, v in copy.items())
    for name, v in copy.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "w":
            assert bool((v == 1).all()), name
        elif leaf.startswith("b"):
            assert bool((v == 0).all()), name
        else:
            assert not torch.equal(v, before[name]) and abs(float(v.std()) - model.cfg.initializer_range) < 0.5 * model.cfg.initializer_range, name
    toks = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(a(toks), model(toks)) and not a.training
    assert ri.certify(a).holds("stream", "z", "heads", "gradients")
