"""The tasks' causal models and pair sets: the counterfactual labels written out here, the base and the
source as long in tokens, the classes the words they say (GPT-2's tokenizer)."""

from __future__ import annotations

import pytest
import torch

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
    for i in range(6):
        b, s = tok.decode(order.base[i]), tok.decode(order.source[i])
        io, subj = (tok.decode([int(c)]).strip() for c in order.candidates[i])
        assert b.count(subj) == 2 and b.count(io) == 1  # the subject is repeated
        first_b, first_s = b.index(io) < b.index(subj), None
        assert int(order.labels[i]) == 1 and int(order.base_labels[i]) == 0 and first_s is None and first_b in (True, False)
    io = ioi_pairs(tok, 4, seed=0, variable="io")
    assert all(tok.decode([int(io.candidates[i, 1])]).strip() in tok.decode(io.source[i]) for i in range(4))
    assert torch.equal(order.lengths("base"), order.lengths("source"))


def test_greater_than_and_sva_pairs(tok):
    gt = greater_than_pairs(tok, 5, seed=0)
    for i in range(5):
        yy_b, yy_s = (int(tok.decode([int(p[i, -3])])) for p in (gt.base, gt.source))  # "... year 15|78| to 15"
        got = [tok.decode([int(c)]) for c in gt.candidates[i]]
        assert got == [f"{yy_b + 1:02d}", f"{yy_s + 1:02d}"] and int(gt.labels[i]) == 1
    sva = sva_pairs(tok, 6, seed=0)
    assert [tok.decode([int(c)]) for c in sva.candidates[0]] == [" is", " are"]
    assert bool((sva.labels != sva.base_labels).all())
    with pytest.raises(ValueError, match="variable must be"):
        ioi_pairs(tok, 2, variable="s")
