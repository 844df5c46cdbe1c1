"""Issue 16: second-order (source -> head -> logit) attribution."""

import pytest
import torch

import rs_interp as ri
from tests.builders import VARIANTS, architecture_params, make_variant, variant_id


def _tokens(model, n=2, pos=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, model.cfg.d_vocab, (n, pos), generator=g), torch.randint(0, model.cfg.d_vocab, (n, pos), generator=g))


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_sources_sum_to_each_heads_first_order_part(variant):
    """float64, every bias and gain nonzero: per head, the sources sum to its first-order DLA (1e-9),
    which is direct_logit_attribution's own component (itself checked against autograd)."""
    model = make_variant(*variant, seed=4, n_layers=3)
    toks, tg = _tokens(model)
    so = ri.second_order_attribution(model, toks, targets=tg)
    dla = ri.direct_logit_attribution(model, toks, targets=tg)
    assert (so.contributions.sum(0) - so.first_order).abs().max() <= 1e-9
    for j, d in enumerate(so.destinations):
        assert (so.first_order[j] - dla.contributions[dla.labels.index(d)]).abs().max() <= 1e-9


@pytest.mark.parametrize("variant", [("LN", "standard", False), ("RMS", "rotary", False)], ids=variant_id)
def test_a_source_not_upstream_contributes_exactly_zero(variant):
    model = make_variant(*variant, seed=5, n_layers=3)
    toks, tg = _tokens(model)
    so = ri.second_order_attribution(model, toks, targets=tg)
    for i, s in enumerate(so.sources):
        layer = (int(s[1:].split("H")[0]) if s.startswith("L") else int(s[3:]) if s.startswith("MLP")
                 else int(s.rsplit("L", 1)[1]) if s.startswith("b_O L") else -1)
        for j, d in enumerate(so.destinations):
            if layer >= int(d[1:].split("H")[0]):
                assert bool((so.contributions[i, j] == 0).all()), (s, d)


@pytest.mark.parametrize("contrast", [False, True])
def test_head_to_head_terms_are_theorem_3_two_head_paths(toy2_f64, small_batch, contrast):
    toks = small_batch.tokens[:4]
    tg = ri.next_token_targets(toks)  # the last position is skipped (-1): its parts are 0
    ct = toks if contrast else None
    so = ri.second_order_attribution(toy2_f64, toks, targets=tg, contrast=ct)
    pe = ri.path_expansion(toy2_f64, toks)
    pick = lambda t: pe.contributions.gather(-1, t[None, ..., None].expand(len(pe.labels), -1, -1, 1))[..., 0]  # noqa: E731
    paths = dict(zip(pe.labels, pick(tg.clamp(min=0)) - (pick(ct) if contrast else pe.contributions.mean(-1))))
    assert bool((so.contributions[..., -1] == 0).all()) and bool((so.first_order[..., -1] == 0).all())
    for src in ("L0H0", "L0H1", "W_E"):
        for dst in ("L1H0", "L1H1"):
            key = dst if src == "W_E" else f"{src}>{dst}"
            got = so.contributions[so.sources.index(src), so.destinations.index(dst)]
            assert (got[:, :-1] - paths[key][:, :-1]).abs().max() <= 1e-10, key


def test_positions_and_memory_budget_change_nothing_but_the_work(gpt2_tiny):
    toks, tg = _tokens(gpt2_tiny, pos=12)
    full = ri.second_order_attribution(gpt2_tiny, toks, targets=tg)
    last = ri.second_order_attribution(gpt2_tiny, toks, targets=tg, positions=[-1], memory_budget=1)
    assert last.positions == (11,)
    assert (last.contributions[..., 0] - full.contributions[..., -1]).abs().max() <= 1e-5
    assert (full.contributions.sum(0) - full.first_order).abs().max() <= 1e-4  # float32


def test_a_hook_that_changes_what_a_head_reads_is_named(gpt2_tiny):
    toks, tg = _tokens(gpt2_tiny)
    gpt2_tiny.add_hook("blocks.1.hook_resid_pre", lambda t, hook: t * 1.3)
    try:
        with pytest.raises(ValueError, match=r"blocks\.1\.hook_resid_pre"):
            ri.second_order_attribution(gpt2_tiny, toks, targets=tg)
    finally:
        gpt2_tiny.reset_hooks()


@pytest.mark.parametrize("kwargs,message", [(dict(positions=[]), "empty"), (dict(positions=[99]), "positions"),
                                            (dict(memory_budget=0), "memory_budget")])
def test_bad_arguments(toy2, small_batch, kwargs, message):
    toks = small_batch.tokens[:2]
    with pytest.raises(ValueError, match=message):
        ri.second_order_attribution(toy2, toks, targets=toks, **kwargs)


def test_minus_one_skips_a_position(gpt2_tiny):
    """A skipped target (-1) gives 0 parts at that position; the others are as with any target there."""
    toks, tg = _tokens(gpt2_tiny, pos=12)
    skipped = tg.clone()
    skipped[:, 3] = -1
    so = ri.second_order_attribution(gpt2_tiny, toks, targets=skipped)
    full = ri.second_order_attribution(gpt2_tiny, toks, targets=tg)
    assert bool((so.contributions[..., 3] == 0).all()) and bool((so.first_order[..., 3] == 0).all())
    keep = [p for p in range(12) if p != 3]
    assert (so.contributions[..., keep] - full.contributions[..., keep]).abs().max() <= 1e-6  # float32
