"""Pair sets: every malformed one refused saying what is wrong, rows grouped by length, subsets and splits,
the class scores read from logits (candidates, padding, a numerical output), and the arbitrary labels
(TransformerLens 4.3's rule, side by side under 4.x)."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
import torch

from rs_interp import _backend
from rs_interp.variables import PairSet, arbitrary_labels


def _pairs(**over) -> PairSet:
    n = 4
    fields = dict(base=torch.arange(12).reshape(n, 3), source=torch.arange(12).reshape(n, 3) + 1,
                  labels=torch.tensor([0, 1, 0, 0]), base_labels=torch.tensor([0, 0, 0, 1]),
                  read=torch.tensor([2, 2, 1, 2]), candidates=torch.tensor([[5, 6], [5, 6], [7, -1], [5, 6]]),
                  base_positions=torch.tensor([1, 1, 0, 2]), source_positions=torch.tensor([1, 0, 0, 2]))
    fields.update(over)
    return PairSet(**fields)


@pytest.mark.parametrize("over, words", [
    (dict(source=torch.zeros(3, 3, dtype=torch.long)), "3 rows, base 4"),
    (dict(labels=torch.tensor([0, 1])), r"\(4,\) tensor"),
    (dict(base=torch.zeros(4, 3)), "integer"),
    (dict(labels=torch.tensor([0, 1, 1, 2])), "valid class"),
    (dict(base_labels=torch.tensor([0, 0, 1, 1])), "valid class"),  # row 2 has one class
    (dict(read=torch.tensor([3, 0, 0, 0])), "read"),
    (dict(base_positions=None), "together"),
    (dict(base_positions=torch.tensor([0, 0, 0, 3])), "inside"),
    (dict(values=torch.tensor([0.0, 1.0])), "exactly one"),
    (dict(base_lengths=torch.tensor([3, 3, 4, 3])), "lengths"),
])
def test_a_malformed_pair_set_is_refused(over, words):
    with pytest.raises(ValueError, match=words):
        _pairs(**over)


def test_every_position_needs_rows_as_long():
    with pytest.raises(ValueError, match="as long"):
        _pairs(base_positions=None, source_positions=None, source_lengths=torch.tensor([3, 2, 3, 3]))


def test_groups_subsets_and_splits():
    p = _pairs(base_lengths=torch.tensor([3, 2, 3, 3]), read=torch.tensor([2, 1, 1, 2]),
               base_positions=torch.tensor([1, 1, 0, 2]))
    assert p.groups() == {(3, 3): [0, 2, 3], (2, 3): [1]}
    sub = p.subset([2, 0])
    assert torch.equal(sub.base, p.base[[2, 0]]) and sub.base_labels.tolist() == [0, 0] and sub.read.tolist() == [1, 2]
    train, test = p.split(0.5, seed=1)
    assert sorted(train.labels.tolist() + test.labels.tolist()) == sorted(p.labels.tolist())
    with pytest.raises(ValueError, match="non-empty"):
        p.split(0.0)


def test_class_scores_from_logits():
    p = _pairs()
    logits = torch.randn(4, 3, 9, generator=torch.Generator().manual_seed(0))
    scores = p.task_logits(logits)
    assert scores[0].tolist() == logits[0, 2, [5, 6]].tolist()
    assert scores[2, 0] == logits[2, 1, 7] and scores[2, 1] == float("-inf")
    num = replace(p, candidates=None, values=torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64),
                  labels=torch.tensor([0, 1, 2, 0]), base_labels=torch.tensor([0, 0, 0, 0]))
    x = torch.tensor([0.1, 0.45, 0.9, 0.3]).reshape(4, 1, 1).expand(4, 3, 1)
    assert num.task_logits(x).argmax(-1).tolist() == [0, 1, 2, 1]  # the nearest value


def test_arbitrary_labels_are_a_function_of_the_source():
    p = _pairs(source=torch.tensor([[1, 2, 3], [1, 2, 3], [4, 5, 6], [1, 2, 3]]), source_positions=torch.tensor([1, 1, 0, 1]))
    a = arbitrary_labels(p, seed=2)
    assert a[0] == a[1] == a[3] and a[2] == 0  # one valid class in row 2
    assert torch.equal(a, arbitrary_labels(p, seed=2))


@pytest.mark.skipif(_backend.TL_MAJOR < 4, reason="TransformerLens 4.3's arbitrary_targets (not in 3.x)")
def test_arbitrary_labels_are_transformerlens_rule():
    tl = importlib.import_module("transformer_lens.tools.analysis.interchange")
    keys = tuple(f"source {i % 5}" for i in range(20))
    p = PairSet(base=torch.zeros(20, 2, dtype=torch.long), source=torch.zeros(20, 2, dtype=torch.long),
                labels=torch.zeros(20, dtype=torch.long), base_labels=torch.zeros(20, dtype=torch.long),
                read=torch.ones(20, dtype=torch.long), candidates=torch.arange(3).expand(20, 3), keys=keys)
    assert torch.equal(arbitrary_labels(p, seed=7), tl.arbitrary_targets(keys, 3, seed=7))
