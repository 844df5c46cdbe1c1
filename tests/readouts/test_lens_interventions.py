"""Interventions along J-lens vectors (issue 62), each against its identity: the vectors are ``J^T W_U`` written
out; steering adds exactly the stated vector at the positions named; ablation leaves no component along any token's
vector; a swap exchanges the two coordinates and leaves the component orthogonal to their span unchanged; the clamp
sets a clean run's exchanged coordinates (idempotent); TransformerLens 4.3's hooks do the same (4.x only)."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from tests.builders import TL4, make_variant
from tests.readouts.test_jacobian_readout import BEYOND, beyond_id, near_identity_lens, post_norm_soft_capped


@pytest.fixture(scope="module")
def fitted():
    model = make_variant("LN", "standard", False, n_layers=3, d_vocab=60)
    tokens = torch.randint(0, 60, (2, 10), generator=torch.Generator().manual_seed(0))
    return model, tokens, ri.fit_jacobian_lens(model, tokens, skip_first=2, progress=False)


def around(model, tokens, hooks, layer):
    """The stream after block ``layer`` as it enters the hooks and as it leaves them."""
    seen = {}
    name = f"blocks.{layer}.hook_resid_post"
    with model.hooks(fwd_hooks=[(name, lambda t, hook: seen.__setitem__("in", t.clone()))] + hooks
                     + [(name, lambda t, hook: seen.__setitem__("out", t.clone()))]):
        model(tokens)
    return seen["in"], seen["out"]


def test_the_vectors_are_the_unembedding_read_back_through_the_lens(fitted):
    model, _, lens = fitted
    v = ri.readouts.lens_vectors(model, lens, [3, 11], 1)
    assert (v - (lens.matrix(1).T @ model.W_U[:, [3, 11]]).T).abs().max() <= 1e-12


@pytest.mark.parametrize("positions", [None, [2, -1]])
def test_steering_adds_exactly_the_stated_vector(fitted, positions):
    model, tokens, lens = fitted
    steer = ri.readouts.lens_steering_hooks(model, lens, 5, [1], alpha=1.5, positions=positions)
    h, out = around(model, tokens, steer, 1)
    at = list(range(10)) if positions is None else [2, 9]
    v = ri.readouts.lens_vectors(model, lens, 5, 1)[0]
    want = 1.5 * h[:, at].norm(dim=-1).median() * v / v.norm()
    assert (out[:, at] - h[:, at] - want).abs().max() <= 1e-12
    rest = [p for p in range(10) if p not in at]
    assert torch.equal(out[:, rest], h[:, rest])
    assert torch.equal(around(model, tokens, ri.readouts.lens_steering_hooks(model, lens, 5, [1], alpha=0.0), 1)[1], h)


def test_ablation_leaves_no_component_along_the_tokens(fitted):
    model, tokens, lens = fitted
    h, out = around(model, tokens, ri.readouts.lens_ablation_hooks(model, lens, [5, 6, 7], [1]), 1)
    V = ri.readouts.lens_vectors(model, lens, [5, 6, 7], 1)
    assert (out @ V.T).abs().max() <= 1e-12 * h.abs().max() * V.norm(dim=1).max()
    removed = h - out  # within the span of the three vectors
    coef = torch.linalg.lstsq(V.T, removed.reshape(-1, 16).T).solution
    assert (V.T @ coef - removed.reshape(-1, 16).T).abs().max() <= 1e-10


def test_a_swap_exchanges_the_two_coordinates_and_keeps_the_rest(fitted):
    model, tokens, lens = fitted
    h, out = around(model, tokens, ri.readouts.lens_swap_hooks(model, lens, 3, 4, [1]), 1)
    V = ri.readouts.lens_vectors(model, lens, [3, 4], 1).T
    P = V @ torch.linalg.pinv(V)  # the projection onto span{v_s, v_t}
    c_in, c_out = h @ torch.linalg.pinv(V).T, out @ torch.linalg.pinv(V).T
    assert (c_out - c_in[..., [1, 0]]).abs().max() <= 1e-10 * c_in.abs().max()
    assert ((out - out @ P.T) - (h - h @ P.T)).abs().max() <= 1e-10 * h.abs().max()
    _, double = around(model, tokens, ri.readouts.lens_swap_hooks(model, lens, 3, 4, [1], alpha=2.0), 1)
    assert ((double @ torch.linalg.pinv(V).T) - (2 * c_in[..., [1, 0]] - c_in)).abs().max() <= 1e-9 * c_in.abs().max()


def test_the_clamp_sets_the_clean_runs_exchanged_coordinates(fitted):
    model, tokens, lens = fitted
    _, clean = model.run_with_cache(tokens)
    other = torch.randint(0, 60, (2, 10), generator=torch.Generator().manual_seed(9))
    hooks = ri.readouts.lens_swap_hooks(model, lens, 3, 4, [1], clamp_to=clean)
    h, out = around(model, other, hooks, 1)
    pinv = torch.linalg.pinv(ri.readouts.lens_vectors(model, lens, [3, 4], 1).T)
    want = (clean["blocks.1.hook_resid_post"] @ pinv.T)[..., [1, 0]]
    assert (out @ pinv.T - want).abs().max() <= 1e-10 * want.abs().max()
    assert (around(model, other, hooks + hooks, 1)[1] - out).abs().max() <= 1e-10 * out.abs().max()  # idempotent
    with pytest.raises(ValueError, match="clamp_to has no activation"):
        ri.readouts.lens_swap_hooks(model, lens, 3, 4, [0], clamp_to={})


def test_degenerate_swaps_are_refused(fitted):
    model, _, lens = fitted
    with pytest.raises(ValueError, match="same token"):
        ri.readouts.lens_swap_hooks(model, lens, 3, 3, [1])
    u = torch.randn(16, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    flat = ri.JacobianLens((u @ u.T).expand(2, 16, 16), (0, 1), n_prompts=1)  # every lens vector along u
    with pytest.raises(ValueError, match="near-parallel"):
        ri.readouts.lens_swap_hooks(model, flat, 3, 4, [1])
    with pytest.raises(ValueError, match="source layers"):
        ri.readouts.lens_steering_hooks(model, lens, 3, [2])


@pytest.mark.slow
@pytest.mark.skipif(not TL4, reason="TransformerLens 4.3's JacobianLens hooks are the comparison (4.x only)")
def test_transformer_lens_hooks_do_the_same(tmp_path):
    """TransformerLens 4.3's steering, ablation and swap hooks on its raw bridge, ours on the same checkpoint loaded
    raw by rs_interp: the same streams after the hooked block (float32)."""
    import warnings

    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import JacobianLens as TLLens

    from tests.hf_families import save_checkpoint

    save_checkpoint("gpt2", tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(str(tmp_path), device="cpu")
    bridge.eval()
    model = ri.load_pretrained(tmp_path, fold_ln=False)
    tokens = torch.randint(1, 299, (1, 12), generator=torch.Generator().manual_seed(2))
    lens = ri.fit_jacobian_lens(model, tokens, skip_first=2, progress=False)
    theirs = TLLens({0: lens.matrix(0)}, n_prompts=1, d_model=32, metadata={"model_name": bridge.cfg.model_name})
    for mine, tl in [(ri.readouts.lens_steering_hooks(model, lens, 5, [0], alpha=2.0),
                      theirs.steering_hooks(bridge, 5, [0], alpha=2.0)),
                     (ri.readouts.lens_ablation_hooks(model, lens, [5, 6], [0]),
                      theirs.ablation_hooks(bridge, [5, 6], [0])),
                     (ri.readouts.lens_swap_hooks(model, lens, 5, 6, [0]), theirs.swap_hooks(bridge, 5, 6, [0]))]:
        out = {}
        with bridge.hooks(fwd_hooks=tl + [("blocks.0.hook_out", lambda t, hook: out.__setitem__("tl", t))]):
            bridge(tokens)
        assert (around(model, tokens, mine, 0)[1] - out["tl"]).abs().max() <= 1e-4 * out["tl"].abs().max()


# --- against a brute force on the raw forward, on variants beyond the fitted one -----------------------------------


def edit_by_hand(model, lens, layer, kind, ids, positions, alpha, clean=None):
    """One plain hook doing the edit from its definition, in float64: ``v_t = J^T W_U[:, t]``; steering adds ``alpha``
    times the median norm of the streams edited along ``v / ||v||``; ablation removes the least-squares projection
    onto the vectors' span; a swap solves the normal equations for the two coordinates (no pseudoinverse) and moves
    them to their exchange (or a clean run's exchanged ones)."""
    V = (lens.matrix(layer).double().T @ model.W_U.detach().double()[:, ids]).T  # (tokens, d_model)
    d = V.shape[1]

    def coords(x):  # (rows, d) -> (rows, tokens), from (V V^T) c = V x
        return torch.linalg.solve(V @ V.T, V @ x.T).T

    def fn(t, hook):
        h = t.double().clone()
        at = list(range(h.shape[1])) if positions is None else [p % h.shape[1] for p in positions]
        x = h[:, at].reshape(-1, d)
        if kind == "steer":
            x = x + alpha * x.norm(dim=-1).median() * V[0] / V[0].norm()
        elif kind == "ablate":
            x = x - coords(x) @ V
        else:
            want = coords(x)[:, [1, 0]] if clean is None else coords(clean[:, at].double().reshape(-1, d))[:, [1, 0]]
            x = x + alpha * (want - coords(x)) @ V
        h[:, at] = x.reshape(h.shape[0], len(at), d)
        return h.to(t.dtype)

    return (f"blocks.{layer}.hook_resid_post", fn)


EDITS = [("steer", [5], [2, -1], 1.5), ("ablate", [5, 6, 7], None, 1.0), ("swap", [3, 4], [1, 4, -2], 1.0),
         ("swap", [3, 4], None, 2.0), ("clamp", [3, 4], [3, -1], 1.0)]


def _helper_hooks(model, lens, kind, ids, layers, positions, alpha, clean):
    if kind == "steer":
        return ri.readouts.lens_steering_hooks(model, lens, ids[0], layers, alpha=alpha, positions=positions)
    if kind == "ablate":
        return ri.readouts.lens_ablation_hooks(model, lens, ids, layers, positions=positions)
    return ri.readouts.lens_swap_hooks(model, lens, *ids, layers, alpha=alpha, positions=positions,
                              clamp_to=clean if kind == "clamp" else None)


def _check_edits_by_hand(model, tokens, rel):
    lens = near_identity_lens(model, seed=4)
    layers = list(lens.source_layers)
    other = torch.randint(1, 50, tokens.shape, generator=torch.Generator().manual_seed(8))
    _, clean = model.run_with_cache(other)
    # a user's row-dependent hook left on the model: every run below goes through it
    model.add_hook("blocks.0.hook_resid_pre", lambda t, hook: t * (1 + 0.1 * torch.arange(t.shape[0]))[:, None, None])
    try:
        plain = model(tokens)
        for kind, ids, positions, alpha in EDITS:
            with model.hooks(fwd_hooks=_helper_hooks(model, lens, kind, ids, layers, positions, alpha, clean)):
                got = model(tokens)
            hand = [edit_by_hand(model, lens, l, kind, ids, positions, alpha,
                                 clean[f"blocks.{l}.hook_resid_post"] if kind == "clamp" else None) for l in layers]
            want = model.run_with_hooks(tokens, fwd_hooks=hand)
            assert (got.double() - want.double()).abs().max() <= rel * want.abs().max(), kind
            assert (want - plain).abs().max() > 1e-3 * plain.abs().max(), kind  # the edit moved the logits
    finally:
        model.reset_hooks(including_permanent=False)


@pytest.mark.parametrize("variant", BEYOND, ids=beyond_id)
def test_each_edit_is_its_definition_on_the_raw_forward(variant):
    model = make_variant(*variant, n_layers=3)
    _check_edits_by_hand(model, torch.randint(1, 50, (2, 10), generator=torch.Generator().manual_seed(2)), 1e-10)


@pytest.mark.slow  # a Hugging Face checkpoint written and loaded: seconds
def test_each_edit_is_its_definition_on_a_post_norm_soft_capped_family(tmp_path):
    model, rel = post_norm_soft_capped(tmp_path, 1e-10)
    _check_edits_by_hand(model, torch.randint(1, 299, (2, 9), generator=torch.Generator().manual_seed(2)), rel)
