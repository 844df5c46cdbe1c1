"""The causal-model type: its checks, a run with values fixed (a whole value, one entry of a per-position
one), counterfactuals, the variables that differ and those computed from a variable, on a model whose
answers are written out here."""

from __future__ import annotations

import pytest

from rs_interp.variables import CausalModel, Variable


def _model() -> CausalModel:
    # out[i] = a[i] + b, with a the input's entries doubled and b their count
    return CausalModel("toy", (
        Variable("a", ("input",), lambda x: tuple(2 * v for v in x), True),
        Variable("b", ("input",), len),
        Variable("out", ("a", "b"), lambda a, b: tuple(v + b for v in a), True),
    ), output="out")


def test_run_fixed_and_counterfactual():
    cm = _model()
    assert cm.run((1, 2))["out"] == (4, 6)
    assert cm.run((1, 2), {"b": 10})["out"] == (12, 14)
    assert cm.run((1, 2), {"a": {1: 0}})["out"] == (4, 2)
    assert cm.counterfactual((1, 2), (5, 6, 7), "b") == (5, 7)
    assert cm.counterfactual((1, 2), (5, 6, 7), "a", at=(0, 2)) == (16, 6)
    assert cm.differing((1, 2), (1, 3), at=(0, 0)) == ()
    assert cm.differing((1, 2), (1, 3)) == ("a", "out")
    assert cm.descendants("a") == {"out"} and cm.descendants("out") == set()


@pytest.mark.parametrize("variables, output, words", [
    ((Variable("a", ("b",), len),), "a", "not computed before"),
    ((Variable("a", ("input",), len), Variable("a", ("input",), len)), "a", "used twice"),
    ((Variable("input", ("input",), len),), "input", "reserved"),
    ((Variable("a", ("input",), len),), "z", "not one of its variables"),
])
def test_a_malformed_model_is_refused(variables, output, words):
    with pytest.raises(ValueError, match=words):
        CausalModel("bad", variables, output)


def test_unknown_and_misused_variables_are_refused():
    cm = _model()
    with pytest.raises(ValueError, match="no variable 'c'"):
        cm.counterfactual((1,), (2,), "c")
    with pytest.raises(ValueError, match="not per-position"):
        cm.run((1, 2), {"b": {0: 3}})
