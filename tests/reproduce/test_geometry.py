"""The geometry lab: Proposition 1, Theorem 1, Proposition 2, Proposition 3, Corollary 1, Theorem 2 (i)."""

import math

import pytest
import torch

import rs_interp as ri
from rs_interp.reproduce.expected import EXPECTED
from rs_interp.reproduce.geometry import (
    centering_projection,
    collapse_cloud,
    collapse_run,
    diameter,
    dobrushin_coefficient,
    layer_norm,
    layer_norm_jacobian,
    operator_norm,
    residual_jacobian_expansion,
    rms_norm,
)

NORMS = [1, 2, "inf"]
F64 = torch.float64


def _random_stochastic(g, n):
    return torch.softmax(3 * torch.randn(n, n, generator=g, dtype=F64), -1)


# ---- Proposition 1 on a TransformerLens model --------------------------------------------------


def test_mha_is_the_sum_of_head_results(gpt2_tiny):
    model = ri.as_dtype(gpt2_tiny, F64)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    for l in range(model.cfg.n_layers):
        results = torch.einsum("bphd,hdm->bphm", cache[f"blocks.{l}.attn.hook_z"], model.blocks[l].attn.W_O)  # per head
        heads = results.sum(-2) + model.blocks[l].attn.b_O
        assert (heads - cache[f"blocks.{l}.hook_attn_out"]).abs().max() <= 1e-12


def test_mlp_is_a_key_value_sum(gpt2_tiny):
    """MLP(x) = b_2 + sum_i sigma(<x, k_i> + b_1i) v_i, row by row."""
    model = ri.as_dtype(gpt2_tiny, F64)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    mlp = model.blocks[1].mlp
    x = model.blocks[1].ln2(cache["blocks.1.hook_resid_mid"])  # the MLP's input
    assert model.cfg.act_fn == "gelu_new"
    act = lambda u: torch.nn.functional.gelu(u, approximate="tanh")  # noqa: E731  (gelu_new, written out)
    out = mlp.b_out.clone().expand_as(x).clone()
    for i in range(model.cfg.d_mlp):  # the key-value reading, one memory slot at a time
        out = out + act(x @ mlp.W_in[:, i] + mlp.b_in[i])[..., None] * mlp.W_out[i]
    assert (out - cache["blocks.1.hook_mlp_out"]).abs().max() <= 1e-12


# ---- Definition 2, Theorem 1, Proposition 2 ---------------------------------------------------


def test_two_forms_of_tau_agree_and_extremes():
    g = torch.Generator().manual_seed(0)
    A = torch.stack([_random_stochastic(g, 7) for _ in range(50)])
    assert (dobrushin_coefficient(A) - dobrushin_coefficient(A, form="overlap")).abs().max() <= 1e-12
    assert dobrushin_coefficient(torch.full((4, 4), 0.25, dtype=F64)) == 0
    assert dobrushin_coefficient(torch.eye(4, dtype=F64)) == 1


@pytest.mark.parametrize("p", NORMS)
def test_theorem_1_i_and_ii(p):
    g = torch.Generator().manual_seed(1)
    for _ in range(300):
        n, d = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        S = torch.randn(n, n, generator=g, dtype=F64) * float(torch.rand(1, generator=g, dtype=F64) * 4)
        A, X = torch.softmax(S, -1), torch.randn(n, d, generator=g, dtype=F64)
        tau = dobrushin_coefficient(A)
        assert diameter(A @ X, p) <= tau * diameter(X, p) + 1e-12  # (i)
        r = (S.amax(-1) - S.amin(-1)).max()
        assert tau <= 1 - torch.exp(-r) + 1e-12  # (ii)


@pytest.mark.parametrize("p", NORMS)
def test_theorem_1_iii_and_proposition_2_on_random_stacks(p):
    g = torch.Generator().manual_seed(2)
    for _ in range(100):
        n, d, L = 6, 3, 5
        X = torch.randn(n, d, generator=g, dtype=F64)
        X_pure, X_skip = X, X
        bound = diameter(X, p)
        for _ in range(L):
            W = torch.randn(d, d, generator=g, dtype=F64)
            W = W / operator_norm(W, p) * float(torch.rand(1, generator=g, dtype=F64))  # ||W|| <= 1
            A = _random_stochastic(g, n)
            tau = dobrushin_coefficient(A)
            X_pure = A @ X_pure @ W
            bound = bound * tau * operator_norm(W, p)
            assert diameter(X_pure, p) <= bound + 1e-12  # Theorem 1 (iii)
            before = diameter(X_skip, p)
            X_next = X_skip + A @ X_skip @ W
            assert diameter(X_next, p) >= (1 - tau * operator_norm(W, p)) * before - 1e-12  # Proposition 2
            pair = torch.linalg.vector_norm(X_next[:, None] - X_next[None], ord=float(p) if p != "inf" else math.inf, dim=-1)
            old = torch.linalg.vector_norm(X_skip[:, None] - X_skip[None], ord=float(p) if p != "inf" else math.inf, dim=-1)
            assert (pair >= old - tau * operator_norm(W, p) * before - 1e-12).all()
            X_skip = X_next


def test_operator_norms_are_attained_bounds():
    g = torch.Generator().manual_seed(3)
    W = torch.randn(4, 4, generator=g, dtype=F64)
    for p in NORMS:
        ordp = math.inf if p == "inf" else float(p)
        xs = torch.randn(2000, 4, generator=g, dtype=F64)
        ratios = torch.linalg.vector_norm(xs @ W, ord=ordp, dim=-1) / torch.linalg.vector_norm(xs, ord=ordp, dim=-1)
        assert ratios.max() <= operator_norm(W, p) + 1e-12
        assert ratios.max() >= 0.7 * operator_norm(W, p)


def test_the_counterexample_merges_two_tokens():
    X = torch.tensor([[0.0], [0.1], [10.0]], dtype=F64)
    A = torch.tensor([[0.9, 0, 0.1], [0.91, 0, 0.09], [0.9, 0, 0.1]], dtype=F64)
    assert float(dobrushin_coefficient(A)) == pytest.approx(0.01, abs=1e-12)
    Y = X + A @ X
    assert torch.allclose(Y, torch.tensor([[1.0], [1.0], [11.0]], dtype=F64), atol=1e-12)
    assert float(diameter(Y)) == pytest.approx(10.0, abs=1e-12)


# ---- the collapse experiment ---------------------------------------------------------------------


BETAS = [0.25, 0.5, 1.0, 2.0, 4.0]


@pytest.mark.parametrize("beta", BETAS)
def test_collapse_experiment(beta):
    X0 = collapse_cloud()
    pure, skip = collapse_run(X0, beta), collapse_run(X0, beta, skip=True)
    assert (pure.diameter <= pure.bound + 1e-12).all()  # the bound holds at every layer
    assert (skip.diameter[1:] >= skip.diameter[:-1] - 1e-12).all()  # with the skip it never shrinks
    if float(pure.tau.max()) < 0.99:
        assert pure.diameter[-1] < 1e-6 * pure.diameter[0]  # geometric collapse


def test_taus_rise_with_beta_and_the_skip_keeps_diameter_not_share():
    X0 = collapse_cloud()
    taus = [float(collapse_run(X0, b).tau[0]) for b in BETAS]
    assert taus == sorted(taus) and taus[0] < 0.5 and taus[-1] > 0.9
    wide = collapse_run(X0, 0.25, skip=True)
    assert wide.diameter[-1] >= wide.diameter[0]
    assert wide.relative_spread[-1] < 0.5 * wide.relative_spread[0]


# ---- LayerNorm ----------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 3, 8, 64])
def test_proposition_3(d):
    g = torch.Generator().manual_seed(d)
    P = centering_projection(d)
    for _ in range(20):
        x = torch.randn(d, generator=g, dtype=F64) * 3 + 1
        Px = P @ x
        ln = layer_norm(x)
        assert torch.allclose(ln, math.sqrt(d) * Px / Px.norm(), atol=1e-12)
        c, s = float(torch.rand(1, generator=g, dtype=F64)) * 5 + 0.1, float(torch.randn(1, generator=g, dtype=F64))
        assert torch.allclose(layer_norm(c * x + s), ln, atol=1e-12)
        assert torch.allclose(layer_norm(ln), ln, atol=1e-12)
        assert torch.allclose(rms_norm(Px), ln, atol=1e-12)
        # TransformerLens's LayerNorm with eps=0 agrees
        assert ln.norm() == pytest.approx(math.sqrt(d), abs=1e-12)


@pytest.mark.parametrize("d", [2, 3, 8, 64])
def test_corollary_1_against_autograd(d):
    g = torch.Generator().manual_seed(10 + d)
    x = torch.randn(d, generator=g, dtype=F64)
    J = layer_norm_jacobian(x)
    J_auto = torch.autograd.functional.jacobian(layer_norm, x)
    assert (J - J_auto).abs().max() <= 1e-10
    assert torch.allclose(J, J.T, atol=1e-12)
    assert (J @ torch.ones(d, dtype=F64)).abs().max() <= 1e-12 and (J @ x).abs().max() <= 1e-12
    sv = torch.linalg.svdvals(J)
    expected = math.sqrt(d) / (centering_projection(d) @ x).norm()
    assert torch.allclose(sv[: d - 2], torch.full((d - 2,), float(expected), dtype=F64), atol=1e-10)
    assert sv[d - 2 :].abs().max() <= 1e-10


def test_thin_shell():
    def median_radial_change(d):
        x = torch.randn(20000, d, generator=torch.Generator().manual_seed(d), dtype=F64)
        Px = x - x.mean(-1, keepdim=True)
        return float(((layer_norm(x) - Px).norm(dim=-1) / Px.norm(dim=-1)).median())

    assert median_radial_change(512) < 0.025
    assert median_radial_change(8) > 0.1


# ---- Theorem 2 (i) ---------------------------------------------------------------------------------


@pytest.mark.parametrize("L", [1, 3, 4])
def test_identity_path_subset_sum(L):
    g = torch.Generator().manual_seed(L)
    d = 5
    Ws = [torch.randn(d, d, generator=g, dtype=F64) / math.sqrt(d) for _ in range(L)]
    fs = [lambda v, W=W: torch.tanh(v @ W) for W in Ws]
    exp = residual_jacobian_expansion(fs, torch.randn(d, generator=g, dtype=F64))
    assert len(exp.terms) == 2**L
    assert torch.equal(exp.terms[()], torch.eye(d, dtype=F64))
    assert (exp.total() - exp.product).abs().max() <= 1e-12
    assert (exp.product - exp.autograd).abs().max() <= 1e-12


# ---- pre-LN vs post-LN gradients ---------------------------------------------------------------------


@pytest.mark.slow
def test_pre_vs_post_ln_gradient_table():
    from rs_interp.reproduce.gradients import gradient_scaling

    r6, r12, r24 = gradient_scaling((6, 12, 24), n_draws=8)
    # the bands of reproduce/expected.py (the one place a band is typed)
    assert EXPECTED["geometry.pre_ln_fall"].holds(r6.pre_ln_last / r24.pre_ln_last)
    posts = [r.post_ln_last for r in (r6, r12, r24)]
    assert EXPECTED["geometry.post_ln_flat"].holds(max(posts) / min(posts))
    assert EXPECTED["geometry.post_over_pre"].holds(r24.post_ln_last / r24.pre_ln_last)
    assert r6.pre_ln_stream_norm < r12.pre_ln_stream_norm < r24.pre_ln_stream_norm
    prods = [r.pre_ln_last * r.pre_ln_stream_norm for r in (r6, r12, r24)]
    assert EXPECTED["geometry.product_flat"].holds(max(prods) / min(prods))
    assert r24.pre_ln_first >= r6.pre_ln_first  # the first block's gradient does not shrink
    assert all(abs(r.post_ln_stream_norm - 8.0) < 1e-9 for r in (r6, r12, r24))  # post-LN pins ||x|| = sqrt(d)


@pytest.mark.parametrize("depth", [1, 3])
def test_redrawn_weights_equal_a_fresh_build(depth):
    """The gradient table redraws one stack's weights per draw instead of building it again: the
    same seed must give the very weights a fresh build gives (under either TransformerLens version)."""
    from rs_interp import _backend
    from rs_interp.reproduce.gradients import pre_ln_stack

    model = pre_ln_stack(depth, seed=5)
    _backend.set_unembedding(model, torch.ones_like(model.W_U))  # as the table does between draws
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(9)
        _backend.reinitialise(model)
    fresh = _backend.portable_state(pre_ln_stack(depth, seed=9))
    redrawn = _backend.portable_state(model)
    assert fresh.keys() == redrawn.keys()
    assert all(torch.equal(fresh[k], redrawn[k]) for k in fresh)
