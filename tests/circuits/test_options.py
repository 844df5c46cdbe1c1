"""Issue 65 item 1: the estimate's options as one frozen, validated value (rs_interp.circuits.options). Each bad
value refused naming its field, each combination without a definition naming both options, the same refusal word
for word from the value and from the helpers' keyword arguments, the points of the line those of
:func:`quadrature`, and the registry's entries running the helpers with their options unchanged (bit for bit)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits.correction import Passes, quadrature
from rs_interp.circuits.methods import GAUSS_STEPS, HESSIAN_STEPS, IG_STEPS, METHODS
from rs_interp.circuits.options import EstimateOptions
from tests.builders import make_variant


@pytest.mark.parametrize("field, value", [
    ("ig_steps", 0), ("ig_steps", 2.5), ("ig_rule", "middle"), ("correction", "newton"), ("qk_fix", 1),
    ("grad_drop", "yes"), ("per_example", None),
])
def test_a_bad_value_is_refused_naming_its_field(field, value):
    with pytest.raises(ValueError, match=field):
        EstimateOptions(**{field: value})


@pytest.mark.parametrize("options, named", [
    ({"qk_fix": True, "ig_steps": 2}, ("QK fix", "ig_steps")),
    ({"grad_drop": True, "correction": "hessian"}, ("GradDrop", "correction")),
    ({"grad_drop": True, "per_example": True}, ("GradDrop", "per_example")),
    ({"ig_rule": "gauss"}, ("gauss", "ig_steps")),
    ({"ig_rule": "gauss", "ig_steps": 2, "correction": "hessian"}, ("Hessian", "Gauss-Legendre")),
])
def test_options_that_do_not_combine_are_refused_naming_both(options, named):
    with pytest.raises(ValueError) as err:
        EstimateOptions(**options)
    assert all(word in str(err.value) for word in named), str(err.value)


@pytest.mark.parametrize("helper", ["attribution_patching", "edge_attribution_patching"])
@pytest.mark.parametrize("options", [
    {"ig_steps": 0}, {"ig_rule": "middle"}, {"qk_fix": True, "ig_steps": 2}, {"grad_drop": True, "per_example": True},
    {"per_example": "no"},
])
def test_the_helpers_refuse_as_the_value_does(helper, options):
    """The keyword arguments are checked by building the value: the same message, before any model run."""
    model = make_variant("LN", "standard", True, n_layers=1)
    tokens = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError) as direct:
        EstimateOptions(**options)
    with pytest.raises(ValueError) as via:
        getattr(ri, helper)(model, tokens, lambda lg: lg[:, -1, 0].sum(), reference=tokens, progress=False, **options)
    assert str(via.value) == str(direct.value)


@pytest.mark.parametrize("options", [{}, {"ig_steps": 3}, {"ig_steps": 2, "ig_rule": "right", "correction": "hessian"},
                                     {"ig_steps": 4, "ig_rule": "gauss"}, {"correction": "hessian"}])
def test_the_line_is_quadratures(options):
    value = EstimateOptions(**options)
    want = quadrature(value.ig_steps, value.ig_rule, value.correction)
    assert tuple(value.line) == want
    assert value.plain_run == (not options)
    assert value.hessian == (options.get("correction") == "hessian")


def test_the_value_is_frozen_and_round_trips():
    value = EstimateOptions(ig_steps=2, per_example=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.ig_steps = 3  # type: ignore[misc]
    assert EstimateOptions(**value.keywords()) == value
    assert set(value.keywords()) == {f.name for f in dataclasses.fields(EstimateOptions)}
    passes = Passes()
    passes.drop, passes.point, passes.phase = 1, 2, 2
    assert passes.at() == (1, 2)


@pytest.mark.parametrize("key, helper, options", [
    ("EAP-IG", "edge_attribution_patching", {"ig_steps": IG_STEPS}),
    ("EAP-H2", "edge_attribution_patching", {"correction": "hessian", "ig_steps": HESSIAN_STEPS}),
    ("EAP-IG-G2", "edge_attribution_patching", {"ig_steps": GAUSS_STEPS, "ig_rule": "gauss"}),
    ("AtP-H", "attribution_patching", {"correction": "hessian"}),
])
def test_the_registry_runs_the_helper_with_its_options(key, helper, options):
    """A registry entry (options built once as an EstimateOptions) gives the direct call's numbers bit for bit, with
    the caller's ``per_example``."""
    model = make_variant("LN", "standard", False, n_layers=1)
    g = torch.Generator().manual_seed(3)
    tokens, reference = (torch.randint(0, model.cfg.d_vocab, (2, 4), generator=g) for _ in range(2))
    metric = lambda lg: lg[:, -1, 0].mean()  # noqa: E731
    method = next(m for m in METHODS.values() if m.key == key)
    got = method.run(model, tokens, metric, reference=reference, per_example=True)
    want = getattr(ri, helper)(model, tokens, metric, reference=reference, per_example=True, progress=False, **options)
    assert torch.equal(got.effect.nan_to_num(7.0), want.effect.nan_to_num(7.0))
    assert torch.equal(got.per_example.nan_to_num(7.0), want.per_example.nan_to_num(7.0))
    assert (got.ig_steps, got.correction) == (options.get("ig_steps"), options.get("correction"))
