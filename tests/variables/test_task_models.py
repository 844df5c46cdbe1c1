"""The tasks' causal models and pair sets: the counterfactual labels written out here, the base and the
source as long in tokens, the classes the words they say (GPT-2's tokenizer)."""

from __future__ import annotations

import pytest
import torch

from rs_interp.tasks.ioi import NAMES
from rs_interp.tokenizers import gpt2_tokenizer
from rs_interp.variables import (
    greater_than_pairs,
    induction_causal_model,
    induction_pairs,
    ioi_pairs,
    sva_pairs,
)


@pytest.fixture(scope="module")
def tok():
    return gpt2_tokenizer()


@pytest.mark.parametrize("variable", ["previous", "query"])
def test_induction_pairs(variable):
    pairs, cm = induction_pairs(6, seed=1, variable=variable, d_vocab=50, seq_len=20, period=5), induction_causal_model()
    for i in range(6):
        base, source = tuple(pairs.base[i].tolist()), tuple(pairs.source[i].tolist())
        answer = base[-5]  # period 5: the token after the query's earlier occurrences
        assert cm.run(base)["output"] == answer == int(pairs.candidates[i, pairs.base_labels[i]])
        j = [k for k in range(1, 20) if (source if variable == "previous" else base)[k - 1] ==
             (base if variable == "previous" else source)[-1]]
        assert int(pairs.candidates[i, pairs.labels[i]]) == base[j[-1] if variable == "query" else j[0]]
    assert (pairs.base_positions is None) == (variable == "previous")


def test_ioi_pairs(tok):
    order = ioi_pairs(tok, 6, seed=0, variable="order")
    def io_first(text: str) -> bool:  # the name said once comes before the one said twice
        names = [w for w in NAMES if f" {w} " in text or f" {w}." in text or f" {w}," in text]
        once, twice = (next(w for w in names if text.count(f" {w}") == k) for k in (1, 2))
        return text.index(f" {once}") < text.index(f" {twice}")

    for i in range(6):
        b, s = tok.decode(order.base[i]), tok.decode(order.source[i])
        io, subj = (tok.decode([int(order.candidates[i, k])]).strip() for k in (order.base_labels[i], order.labels[i]))
        assert b.count(f" {subj}") == 2 and b.count(f" {io}") == 1  # the subject is repeated
        assert io_first(b) != io_first(s)  # the source's order is the other one
        assert int(order.labels[i]) == 1 - i % 2 and int(order.base_labels[i]) == i % 2  # every other row swapped
    io = ioi_pairs(tok, 4, seed=0, variable="io")
    assert all(tok.decode([int(io.candidates[i, io.labels[i]])]).strip() in tok.decode(io.source[i]) for i in range(4))
    assert torch.equal(order.lengths("base"), order.lengths("source"))


def test_greater_than_and_sva_pairs(tok):
    gt = greater_than_pairs(tok, 5, seed=0)
    for i in range(5):
        yy_b, yy_s = (int(tok.decode([int(p[i, -3])])) for p in (gt.base, gt.source))  # "... year 15|78| to 15"
        got = [tok.decode([int(c)]) for c in gt.candidates[i]]
        assert got[int(gt.base_labels[i])] == f"{yy_b + 1:02d}" and got[int(gt.labels[i])] == f"{yy_s + 1:02d}"
    sva = sva_pairs(tok, 6, seed=0)
    assert [tok.decode([int(c)]) for c in sva.candidates[0]] == [" is", " are"]
    assert bool((sva.labels != sva.base_labels).all())
    with pytest.raises(ValueError, match="variable must be"):
        ioi_pairs(tok, 2, variable="s")
