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
