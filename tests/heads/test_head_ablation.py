"""Issue 15: head ablation and scans against a brute-force hook on hook_z, and TransformerLens's patching."""

import pytest
import torch
from transformer_lens import FactoredMatrix
from transformer_lens import patching as tl_patching

import rs_interp as ri
from rs_interp.reproduce.expected import EXPECTED
from tests.builders import TL4, make_variant


def _brute_force(model, tokens, heads, method, reference):
    """Written apart from the library: one plain hook per layer on the raw forward pass."""
    ref_z = {}
    if method != "zero":
        _, cache = model.run_with_cache(reference, names_filter=lambda n: n.endswith("hook_z"))
        ref_z = {l: cache[f"blocks.{l}.attn.hook_z"] for l in range(model.cfg.n_layers)}

    def hook(z, hook):
        l = int(hook.name.split(".")[1])
        z = z.clone()
        for ll, h in heads:
            if ll == l:
                if method == "zero":
                    z[:, :, h] = 0
                elif method == "mean":  # one vector: the mean over batch and positions
                    z[:, :, h] = ref_z[l][:, :, h].mean((0, 1))
                elif method == "position_mean":  # (pos, d_head): the mean over the batch, per position
                    z[:, :, h] = ref_z[l][:, :, h].mean(0)
                else:
                    z[:, :, h] = ref_z[l][:, :, h]
        return z

    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_z"), hook)])


def _models():
    return {"toy": ri.as_dtype(ri.load_toy_model(), torch.float64),
            "ln_mlp": make_variant("LN", "standard", False, seed=2, n_layers=3, n_heads=3),
            # shortformer exists on TransformerLens 3.x only; 4.x's native models get rotary here
            "rms_" + ("rotary" if TL4 else "shortformer"): make_variant("RMSPre", "rotary" if TL4 else "shortformer", False,
                                                                       seed=3, n_layers=2, n_heads=2)}


MODELS = _models()


def _tokens(model, n=3, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (n, min(10, model.cfg.n_ctx)), generator=torch.Generator().manual_seed(seed))


METHODS = ["zero", "mean", "position_mean", "resample"]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("method", METHODS)
def test_ablate_heads_equals_brute_force(name, method):
    model = MODELS[name]
    toks, ref = _tokens(model), _tokens(model, seed=1)
    heads = [(0, 1), (model.cfg.n_layers - 1, 0)]
    got = ri.ablate_heads(model, toks, heads, ablation=method, reference=ref if method != "zero" else None)
    want = _brute_force(model, toks, heads, method, ref if method != "zero" else toks)
    assert (got - want).abs().max() <= 1e-9


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("budget", [1, 2**30])  # one head per pass, and every head of a layer in one pass
def test_scan_equals_one_brute_force_run_per_head(name, method, budget):
    model = MODELS[name]
    toks, ref = _tokens(model), _tokens(model, seed=1)
    metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 3].mean()  # noqa: E731
    scan = ri.head_ablation_scan(model, toks, metric, ablation=method, reference=ref if method != "zero" else None,
                                 memory_budget=budget)
    with torch.no_grad():
        assert scan.clean == pytest.approx(float(metric(model(toks))), abs=1e-12)
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            want = float(metric(_brute_force(model, toks, [(l, h)], method, ref if method != "zero" else toks)))
            assert abs(float(scan.ablated[l, h]) - want) <= 1e-9, (l, h)
    assert torch.equal(scan.effect, scan.ablated - scan.clean)


def test_resample_scan_equals_transformer_lens_patching(gpt2_tiny):
    """TL's get_act_patch_attn_head_out_all_pos, with the reference run as its 'clean' cache (float32)."""
    toks, ref = _tokens(gpt2_tiny, n=2), _tokens(gpt2_tiny, n=2, seed=5)
    metric = lambda logits: logits[:, -1, 7].mean()  # noqa: E731
    _, ref_cache = gpt2_tiny.run_with_cache(ref)
    want = tl_patching.get_act_patch_attn_head_out_all_pos(gpt2_tiny, toks, ref_cache, metric)
    got = ri.head_ablation_scan(gpt2_tiny, toks, metric, ablation="resample", reference=ref)
    assert (got.ablated.float() - want).abs().max() <= 1e-4


def test_copying_scores_equal_factored_matrix_eigenvalues(gpt2_tiny):
    scores = ri.copying_scores(gpt2_tiny)
    with torch.no_grad():
        for l in range(gpt2_tiny.cfg.n_layers):
            for h in range(gpt2_tiny.cfg.n_heads):
                fm = FactoredMatrix((gpt2_tiny.W_E @ gpt2_tiny.W_V[l, h]).double(), (gpt2_tiny.W_O[l, h] @ gpt2_tiny.W_U).double())
                eig = fm.eigenvalues
                assert float(scores[l, h]) == pytest.approx(float(eig.sum().real / eig.abs().sum()), abs=1e-6)


def test_trained_toy_heads_stand_out(toy2, test_set):
    """On the trained toy: the previous-token head is the costliest single ablation, ablating both
    induction heads breaks induction, and the induction heads copy."""
    batch = test_set
    tokens = batch.tokens[:200]
    loss = ri.next_token_loss(batch.targets[:200])
    prev = ri.find_prev_token_head(toy2, tokens)
    scan = ri.head_ablation_scan(toy2, tokens, loss, ablation="mean")
    assert scan.top(1)[0][0] == ri.head_label(*prev) and float(scan.effect[prev]) >= 2.0
    both = float(loss(ri.ablate_heads(toy2, tokens, [(1, 0), (1, 1)], ablation="mean")))
    assert both - scan.clean >= 3.0
    assert all(EXPECTED["ablation.copying_induction"].holds(float(c)) for c in ri.copying_scores(toy2)[1])


@pytest.mark.parametrize("kwargs,message", [
    (dict(heads=[]), "empty"), (dict(heads=[(0, 0), (0, 0)]), "twice"), (dict(heads=[(0, 0)], ablation="max"), "ablation"),
    (dict(heads=[(0, 0)], ablation="resample"), "reference"),
    (dict(heads=[(0, 0)], ablation="resample", reference=torch.zeros(1, 5, dtype=torch.long)), "shape"),
    (dict(heads=[(0, 0)], ablation="position_mean", reference=torch.zeros(2, 5, dtype=torch.long)), "length of tokens"),
])
def test_bad_arguments(toy2, small_batch, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ri.ablate_heads(toy2, small_batch.tokens[:2], **kwargs)


def test_metric_must_be_a_scalar(toy2, small_batch):
    with pytest.raises(ValueError, match="scalar"):
        ri.head_ablation_scan(toy2, small_batch.tokens[:2], lambda logits: logits[:, -1, 0])


@pytest.mark.parametrize("value", ["0.5", None, [1.0], True])
def test_a_metric_returning_no_number_is_named(toy2, small_batch, value):
    with pytest.raises(ValueError, match=f"metric must return a number or a one-element tensor, got {type(value).__name__}"):
        ri.head_ablation_scan(toy2, small_batch.tokens[:2], lambda logits: value)


@pytest.mark.parametrize("positions", [[1, 1], [-1, 9], [0, 3, -10]])
def test_a_position_named_twice_is_refused(toy2, positions):
    toks = ri.induction_batch(2, seed=0).tokens[:, :10]
    with pytest.raises(ValueError, match="more than once"):
        ri.head_ablation_scan(toy2, toks, lambda lg: lg.sum(), positions=positions)
    with pytest.raises(ValueError, match="more than once"):
        ri.second_order_attribution(toy2, toks, targets=ri.next_token_targets(toks), positions=positions)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_positions_restrict_the_logits_not_the_numbers(name):
    model = MODELS[name]
    toks, ref = _tokens(model), _tokens(model, seed=1)
    full = ri.head_ablation_scan(model, toks, lambda lg: lg[:, -1, 3].mean() + lg[:, 2, 1].sum(), ablation="resample", reference=ref)
    part = ri.head_ablation_scan(model, toks, lambda lg: lg[:, 1, 3].mean() + lg[:, 0, 1].sum(), ablation="resample", reference=ref,
                                 positions=[2, -1])
    assert part.clean == pytest.approx(full.clean, abs=1e-10)
    assert (part.ablated - full.ablated).abs().max() <= 1e-10


def test_next_token_loss_is_the_masked_cross_entropy(toy2, small_batch):
    """``next_token_loss(batch.targets)`` = the mean cross-entropy at the scored positions, written
    here by hand (log-softmax and a loop), to 1e-6 in float32; it refuses mismatched logits."""
    batch = small_batch
    logits = toy2(batch.tokens).detach()
    lp = logits.double().log_softmax(-1)
    terms = [-float(lp[b, i, batch.tokens[b, i + 1]]) for b in range(lp.shape[0]) for i in range(lp.shape[1] - 1) if batch.scored[b, i]]
    assert float(ri.next_token_loss(batch.targets)(logits)) == pytest.approx(sum(terms) / len(terms), abs=1e-6)
    with pytest.raises(ValueError, match="differ"):
        ri.next_token_loss(batch.targets)(logits[:, :-1])
    with pytest.raises(ValueError, match="every position"):
        ri.next_token_loss(torch.full_like(batch.tokens, -1))


def test_scan_top_ranks_the_effect(toy2, small_batch):
    """``top(k)``: the k heads of largest |effect|, labelled by head_labels (a sort written here)."""
    scan = ri.head_ablation_scan(toy2, small_batch.tokens, ri.next_token_loss(small_batch.targets))
    want = sorted(zip(ri.head_labels(2, 2), scan.effect.flatten().tolist()), key=lambda x: -abs(x[1]))
    assert scan.top(4) == want and scan.top(2) == want[:2]
    assert scan.labels == ("L0H0", "L0H1", "L1H0", "L1H1")


def test_a_zero_ov_head_scores_zero_not_nan():
    """A head whose W_O is zero has no OV circuit: it neither copies nor suppresses (0), and the other
    heads' scores are untouched (compared with the eigenvalues written out per head)."""
    model = make_variant("LN", "standard", True, seed=4)
    state = ri._backend.portable_state(model)
    state["blocks.1.attn.W_O"][0] = 0
    ri._backend.load_portable_state(model, state)
    scores = ri.copying_scores(model)
    assert float(scores[1, 0]) == 0.0 and not scores.isnan().any()
    W_E, W_U = model.W_E.double(), model.W_U.double()
    eig = torch.linalg.eigvals(model.W_O[0, 1].double() @ W_U @ W_E @ model.W_V[0, 1].double())
    assert float(scores[0, 1]) == pytest.approx(float(eig.sum().real / eig.abs().sum()), abs=1e-9)
