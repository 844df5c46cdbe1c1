import pytest
import torch

import rs_interp as ri


def test_shapes_and_ranges():
    b = ri.induction_batch(500, seed=0)
    assert b.tokens.shape == (500, 48) and b.periods.shape == (500,) and b.scored.shape == (500, 47)
    assert b.periods.min() >= 6 and b.periods.max() <= 24
    assert set(b.periods.unique().tolist()) == set(range(6, 25)), "periods are uniform over [6, 24]"
    assert b.tokens.min() >= 0 and b.tokens.max() < 256


def test_sequences_repeat_with_their_period():
    b = ri.induction_batch(200, seed=1)
    for row, p in zip(b.tokens, b.periods.tolist()):
        assert torch.equal(row[p:], row[:-p])


def test_scored_positions_are_i_ge_p():
    b = ri.induction_batch(100, seed=2)
    i = torch.arange(47)
    assert torch.equal(b.scored, i[None] >= b.periods[:, None])
    # every scored target is the token one period back: induction can predict it
    t = b.targets[:, :-1]  # targets=: (batch, pos), the next token where scored, -1 (skip) elsewhere
    prev = torch.stack([b.tokens[r, 1 + i - p] for r, p in enumerate(b.periods.tolist())])
    assert torch.equal(t[b.scored], prev[b.scored])
    assert bool((t[~b.scored] == -1).all()) and bool((b.targets[:, -1] == -1).all())
    assert torch.equal(t[b.scored], b.tokens[:, 1:][b.scored])


def test_seed_and_generator():
    a, b = ri.induction_batch(8, seed=3), ri.induction_batch(8, seed=3)
    assert torch.equal(a.tokens, b.tokens)
    g = torch.Generator().manual_seed(3)
    c, d = ri.induction_batch(8, generator=g), ri.induction_batch(8, generator=g)
    assert torch.equal(c.tokens, a.tokens) and not torch.equal(c.tokens, d.tokens)


@pytest.mark.parametrize(
    "kwargs,arg",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=4, min_period=0), "min_period"),
        (dict(batch_size=4, max_period=49), "max_period"),
        (dict(batch_size=4, min_period=10, max_period=9), "max_period"),
        (dict(batch_size=4, seq_len=1), "seq_len"),
        (dict(batch_size=4, d_vocab=0), "d_vocab"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ri.induction_batch(**kwargs)
