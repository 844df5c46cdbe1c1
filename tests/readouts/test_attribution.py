"""Direct logit attribution (rs_interp.readouts.attribution): every component's part equals an autograd brute
force written apart from the helper (plain hooks on the raw forward, the final norm's scale frozen), and
the parts sum to the metric, on every variant, under hooks, with skipped targets (-1)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rs_interp as ri
from tests.builders import VARIANTS, architecture_params, make_variant, skipping_targets, variant_id


def test_dla_sums_to_the_metric_on_a_gpt2_shaped_model(gpt2_tiny):
    toks = torch.randint(0, gpt2_tiny.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    tg = ri.next_token_targets(toks)
    dla = ri.direct_logit_attribution(gpt2_tiny, toks, targets=tg)
    n_heads = gpt2_tiny.cfg.n_layers * gpt2_tiny.cfg.n_heads
    assert sum(l.startswith("L") for l in dla.labels) == n_heads
    assert (dla.total() - dla.per_position).abs().max() <= 1e-4
    other = toks
    diff = ri.direct_logit_attribution(gpt2_tiny, toks, targets=tg, contrast=other)
    assert (diff.total() - diff.per_position).abs().max() <= 1e-4


def _brute_force_dla(model, tokens, targets):
    """Independent of the helper: each head's result ``z W_O`` (TransformerLens's ``hook_result``), and each
    component's part as (d metric / d final stream) . component by autograd, with the final norm's
    scale detached (frozen). The constant rest (LN bias, b_U) is metric - grad . stream."""
    cache, stream = {}, {}
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"

    def keep(t, hook):
        cache[hook.name] = t.detach()

    def leaf(t, hook):
        stream["x"] = t.detach().requires_grad_(True)
        return stream["x"]

    fwd = [(lambda n: n.endswith(("hook_embed", "hook_pos_embed", "hook_z", "hook_mlp_out")), keep), (name, leaf)]
    if model.cfg.normalization_type is not None:
        fwd.append(("ln_final.hook_scale", lambda t, hook: t.detach()))
    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=fwd)
        metric = logits.gather(-1, targets[..., None])[..., 0] - logits.mean(-1)
        (grad,) = torch.autograd.grad(metric.sum(), stream["x"])
    part = lambda c: (grad * c).sum(-1)  # noqa: E731
    out = {"W_E": part(cache["hook_embed"])}
    if model.cfg.positional_embedding_type == "standard":
        out["W_pos"] = part(cache["hook_pos_embed"])
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            out[f"L{l}H{h}"] = part(cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ model.blocks[l].attn.W_O[h].detach())
        out[f"b_O L{l}"] = part(model.blocks[l].attn.b_O.detach().expand_as(cache["hook_embed"]))
        if not model.cfg.attn_only:
            out[f"MLP{l}"] = part(cache[f"blocks.{l}.hook_mlp_out"])
    out["constant"] = metric.detach() - part(stream["x"].detach())
    return out, metric.detach()


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_dla_is_exact_on_every_variant(variant):
    """Each component equals the autograd brute force (1e-9), and the sum equals the metric (1e-6), float64."""
    model = make_variant(*variant, seed=1)
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=g)
    tg = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=g)
    dla = ri.direct_logit_attribution(model, toks, targets=tg)
    brute, metric = _brute_force_dla(model, toks, tg)
    assert (dla.per_position - metric).abs().max() <= 1e-10
    assert (dla.total() - metric).abs().max() <= 1e-6
    got = dict(zip(dla.labels, dla.contributions))
    constant = sum(got.pop(k) for k in ("ln_final.b", "b_U") if k in got)
    assert set(got) == set(brute) - {"constant"}  # pos_embed only where it enters the stream
    for k, v in got.items():
        assert (v - brute[k]).abs().max() <= 1e-9, k
    assert (constant - brute["constant"]).abs().max() <= 1e-9


@settings(max_examples=25, deadline=None)
@given(variant=st.sampled_from(VARIANTS), seed=st.integers(0, 1000), n_layers=st.integers(1, 3), n_heads=st.integers(1, 3),
       dtype=st.sampled_from([torch.float32, torch.float64]), contrast=st.booleans())
def test_dla_sums_to_the_metric_property(variant, seed, n_layers, n_heads, dtype, contrast):
    model = make_variant(*variant, seed=seed, n_layers=n_layers, n_heads=n_heads, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=g)
    tg = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=g)
    dla = ri.direct_logit_attribution(model, toks, targets=tg, contrast=toks if contrast else None)
    tol = 1e-6 if dtype == torch.float64 else 1e-4
    assert (dla.total() - dla.per_position).abs().max() <= tol


def test_a_hook_on_z_is_decomposed_with_it():
    """DLA reads z after the user's hook on it: the split is that of the hooked run, and it sums to it."""
    model = make_variant("LN", "standard", False, seed=7)
    toks = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(0))
    model.add_hook("blocks.0.attn.hook_z", lambda t, hook: t * 2.0)
    try:
        dla = ri.direct_logit_attribution(model, toks, targets=toks)
        hooked = model(toks)
    finally:
        model.reset_hooks()
    metric = hooked.gather(-1, toks[..., None])[..., 0] - hooked.mean(-1)
    assert (dla.total() - metric).abs().max() <= 1e-8


@pytest.mark.parametrize("variant", [(None, "rotary", True), ("LN", "standard", False)], ids=variant_id)
def test_dla_skips_minus_one(variant):
    """At a skipped position every part and the metric are 0; elsewhere the parts are the brute force's (1e-9)."""
    model = make_variant(*variant, seed=1)
    toks = torch.randint(0, model.cfg.d_vocab, (2, 10), generator=torch.Generator().manual_seed(2))
    tg, skip = skipping_targets(model, toks)
    dla = ri.direct_logit_attribution(model, toks, targets=tg)
    assert bool((dla.contributions[:, skip] == 0).all()) and bool((dla.per_position[skip] == 0).all())
    brute, metric = _brute_force_dla(model, toks, tg.clamp(min=0))
    assert (dla.per_position[~skip] - metric[~skip]).abs().max() <= 1e-10
    for k, v in zip(dla.labels, dla.contributions):
        if k in brute:
            assert (v[~skip] - brute[k][~skip]).abs().max() <= 1e-9, k
