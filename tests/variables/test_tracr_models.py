"""The tracr programs as causal models: their outputs are the programs' (the plain-Python reference on every
input), and every variable's value is what the compiled model holds in tracr's labelled dimensions at the
stream after the component that writes it (one-hot for a categorical variable, the number itself for a
numerical one), on every input up to length 3 and a sample of longer ones: the causal models are the
compiled models' ground truth, checked against the weights, not assumed. Then where each variable lives,
and the dimensions no later component reads (the docs list them)."""

from __future__ import annotations

import random

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits.tracr import TRACR_PROGRAMS, encode, metadata, reference
from rs_interp.variables import tracr_causal_model, tracr_inputs, tracr_variables
from rs_interp.variables._runs import record


def _inputs(name: str) -> list[tuple]:
    short = tracr_inputs(name, [1, 2, 3])
    longer = tracr_inputs(name, [4, 5])
    return short + random.Random(0).sample(longer, min(60, len(longer)))


@pytest.mark.parametrize("name", TRACR_PROGRAMS)
def test_the_causal_model_is_the_program_and_the_compiled_weights(name):
    cm, model, labels = tracr_causal_model(name), ri.load_toy_model(name), metadata(name).residual_labels
    variables = tracr_variables(name)
    xs = _inputs(name)
    assert all(list(cm.run(x)[cm.output]) == reference(name, x) for x in xs)
    for n in sorted({len(x) for x in xs}):
        group = [x for x in xs if len(x) == n]
        toks = encode(name, [list(x) for x in group])
        for var in variables.values():
            acts = record(model, var.site, toks, None)[:, 1:]  # the BOS holds no value
            own = [i for i, lab in enumerate(labels) if lab.split(":")[0] == var.name]
            for x, row in zip(group, acts):
                for p, value in enumerate(cm.run(x)[var.name]):
                    if var.kind == "numerical":
                        assert abs(float(row[p, own[0]]) - value) < 1e-3, (var.name, x, p)
                    elif value is not None:
                        assert labels[own[int(row[p, own].argmax())]] == f"{var.name}:{value}", (var.name, x, p)


def test_where_the_variables_live():
    reverse = tracr_variables("tracr-reverse")
    assert [(v.writer, v.site.hook) for v in reverse.values()][2:] == [
        ("MLP0", "blocks.0.hook_resid_post"), ("MLP1", "blocks.1.hook_resid_post"),
        ("MLP2", "blocks.2.hook_resid_post"), ("L3H0", "blocks.3.hook_resid_mid")]
    assert reverse["length_5"].unused == ("length_5:0",) and reverse["length_5"].rank == 4
    assert reverse["opp_idx-1_3"].unread == tuple(f"opp_idx-1_3:{v}" for v in range(-5, 0))
    hist = tracr_variables("tracr-hist")
    assert hist["indices"].dims == () and hist["indices"].rank == 0  # no later component reads hist's indices
    with pytest.raises(ValueError, match="no later component reads indices"):
        hist["indices"].basis(18)
    frac = tracr_variables("tracr-frac_prevs")
    assert frac["tokens"].labels == ("tokens:x",) and frac["tokens"].rank == 1  # y and z are never read apart
    assert {v.kind for v in frac.values() if v.name.startswith(("map", "frac"))} == {"numerical"}


def test_the_identifiable_subspace_and_the_kernel():
    var = tracr_variables("tracr-hist")["hist_1"]
    full = var.identifiable(18)
    assert full.shape == (18, 4) and torch.allclose(full.sum(0), torch.zeros(4, dtype=torch.float64), atol=1e-12)
    assert round(float(var.kernel(var.basis(18)).score), 9) == 4.0
    mixed = torch.zeros(18, 1, dtype=torch.float64)
    mixed[var.dims[0]], mixed[var.dims[1]] = 2**-0.5, -(2**-0.5)
    assert round(float(var.kernel(mixed).score), 9) == 1.0


@pytest.mark.parametrize("every, expected", [(True, 15), (False, 19)])
def test_what_a_pair_set_identifies(every, expected):
    """Interchanged at every position of inputs as long, sort's sequence_map_5 (token + index / 5) never moves
    which position a value belongs to: 4 of its 19 directions (5 position groups, less their common mean) are
    never moved, and no loss on those pairs can see them; one position at a time (source and base positions
    drawn apart) moves all 19."""
    from rs_interp.variables import tracr_pairs

    model, var = ri.load_toy_model("tracr-sort"), tracr_variables("tracr-sort")["sequence_map_5"]
    pairs = tracr_pairs("tracr-sort", var.name, n=150 if not every else 60, seed=0, lengths=[5],
                        every_position=every)
    ident = var.identified(model, pairs)
    assert var.rank == 19 and ident.shape == (model.cfg.d_model, expected)
    assert torch.allclose(ident.T @ ident, torch.eye(expected, dtype=torch.float64), atol=1e-12)
    full = var.identifiable(model.cfg.d_model)
    assert torch.allclose(full @ (full.T @ ident), ident, atol=1e-12)  # inside the variable's subspace
    assert abs(float(var.kernel(ident, of=ident).score) - expected) < 1e-9
    if every:
        group = torch.zeros(model.cfg.d_model, dtype=torch.float64)  # a position's values, less the mean of all
        first = [d for d, lab in zip(var.dims, var.labels) if float(lab.split(":")[1]) % 1 == 0]  # index 0
        assert len(first) == 4
        group[first] = 1.0
        group[list(var.dims)] -= 4 / 20
        assert float((ident.T @ group).norm()) < 1e-9


def test_a_subspace_the_loss_cannot_tell_from_tracrs():
    """frac_prevs' `tokens` at the embedding: MLP0 reads tokens:x only to write map_3 = tokens:x (linear in the
    one-hot), and map_3's dimension is empty before MLP0. So the interchange along (tokens:x + map_3) / sqrt 2
    gives the exact counterfactual on every pair (tokens:x moves half way, map_3 gets the other half), though
    its kernel with tracr's tokens:x is 1/2: no pair set can ask DAS for more (docs/capabilities/variables.md)."""
    from rs_interp.variables import interchange, tracr_pairs

    model, var = ri.load_toy_model("tracr-frac_prevs"), tracr_variables("tracr-frac_prevs")["tokens"]
    labels = metadata("tracr-frac_prevs").residual_labels
    pairs = tracr_pairs("tracr-frac_prevs", "tokens", n=24, seed=0, lengths=[5], every_position=True,
                        changed_only=True)
    mix = torch.zeros(model.cfg.d_model, 1)
    mix[labels.index("tokens:x")] = mix[labels.index("map_3")] = 2**-0.5
    exact = interchange(model, pairs, var.site, var.basis(model.cfg.d_model), progress=False)
    other = interchange(model, pairs, var.site, mix, progress=False)
    assert exact.accuracy == other.accuracy == 1.0
    assert torch.allclose(other.logits, exact.logits, atol=1e-5)
    assert abs(float(var.kernel(mix).score) - 0.5) < 1e-6
    with pytest.raises(ValueError, match="not orthonormal"):
        var.kernel(mix, of=2 * var.identifiable(model.cfg.d_model))
