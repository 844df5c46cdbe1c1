"""The Jacobian lens (issue 62): each fitted matrix against a brute force (``torch.autograd.functional.jacobian`` of
the final stream with respect to a layer's, summed and averaged as the reference defines it) on tiny float64 models
of several families; the readout with every matrix the identity against the logit lens, bit for bit; the files both
ways with TransformerLens 4.3's loader; merging; the checkpoint; the map onto a centred stream; the refusals."""

from __future__ import annotations

import warnings

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.readouts.jacobian_lens import CENTRED, RAW, in_model_basis, stream_basis
from tests.builders import TL4, architecture_params, make_variant, variant_id
from tests.hf_families import save_checkpoint

needs_tl43 = pytest.mark.skipif(not TL4, reason=f"TransformerLens {_backend.TL_VERSION} has no "
                                "tools.analysis.JacobianLens (4.3's): its loader is tested under 4.x; here the "
                                "files follow its saver")


def final_stream_of(model, tokens, layer, x):
    """The final stream (1, pos, d_model) with ``blocks.layer.hook_resid_post`` replaced by ``x``: plain hooks."""
    out = {}
    model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.hook_resid_post", lambda t, hook: x),
                                            (f"blocks.{model.cfg.n_layers - 1}.hook_resid_post",
                                             lambda t, hook: out.__setitem__("y", t))])
    return out["y"]


def brute_force(model, prompts, layer, skip_first):
    """``mean over prompts of (1/|V|) sum_{t in V} sum_{t' in V, t' >= t} d h_final[t'] / d h_layer[t]``, every
    per-position block from the full Jacobian (pos, d, pos, d) of one prompt at a time."""
    total = 0
    for tokens in prompts:
        tokens = tokens.reshape(1, -1)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == f"blocks.{layer}.hook_resid_post")
        x0 = cache[f"blocks.{layer}.hook_resid_post"].clone()
        jac = torch.autograd.functional.jacobian(lambda x: final_stream_of(model, tokens, layer, x), x0)[0, :, :, 0]
        V = range(skip_first, tokens.shape[1] - 1)
        total = total + sum(jac[tp, :, t, :] for t in V for tp in V if tp >= t) / len(V)
    return total / len(prompts)


def _prompts(d_vocab, lengths=(9, 7), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, d_vocab, (n,), generator=g) for n in lengths]


def _check_against_brute_force(model, prompts, skip_first, rel=1e-10):
    lens = ri.fit_jacobian_lens(model, prompts, skip_first=skip_first, batch_size=5, progress=False)
    assert lens.source_layers == tuple(range(model.cfg.n_layers - 1)) and lens.n_prompts == len(prompts)
    for layer in lens.source_layers:
        want = brute_force(model, prompts, layer, skip_first)
        assert (lens.matrix(layer) - want).abs().max() <= rel * want.abs().max(), layer
    return lens


VARIANTS = [("LN", "standard", False), ("RMS", "rotary", False), ("LNPre", "standard", True), (None, "rotary", False)]


@pytest.mark.parametrize("variant", VARIANTS + architecture_params([("LN", "rotary", False, "parallel"),
                                                                     ("RMS", "rotary", False, "gqa")]),
                         ids=lambda v: variant_id(v) if isinstance(v, tuple) else None)
def test_each_matrix_is_the_averaged_jacobian(variant):
    model = make_variant(*variant, n_layers=3, n_ctx=12)
    _check_against_brute_force(model, _prompts(50), skip_first=2)


@pytest.mark.parametrize("family", ["gemma2", "gpt_neox"])  # post-norm blocks, soft-capped logits, GQA; parallel blocks
def test_each_matrix_is_the_averaged_jacobian_on_hugging_face_families(family, tmp_path):
    save_checkpoint(family, tmp_path)
    model = ri.load_pretrained(tmp_path, dtype=torch.float64)
    tol = 1e-10 if _backend.model_source(model) == "native" else 1e-6  # booted: some steps in float32 inside
    _check_against_brute_force(model, _prompts(299, lengths=(8,)), skip_first=1, rel=tol)


def test_the_cotangent_batch_only_tiles():
    model = make_variant("LN", "standard", False, n_layers=3, n_ctx=12)
    prompts = _prompts(50)
    one = ri.fit_jacobian_lens(model, prompts, skip_first=2, batch_size=1, progress=False)
    many = ri.fit_jacobian_lens(model, prompts, skip_first=2, batch_size=16, progress=False)
    assert (one.jacobians - many.jacobians).abs().max() <= 1e-14


def test_the_defaults_and_the_skipped_prompts():
    model = make_variant("LN", "standard", False, n_ctx=40)
    prompts = [torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 17, 30)]
    with pytest.warns(UserWarning, match="prompt 1 has 17 tokens"):
        lens = ri.fit_jacobian_lens(model, prompts, progress=False)  # skip_first=16: 17 tokens leave no valid position
    assert lens.n_prompts == 2 and lens.metadata["skip_first_positions"] == 16 and lens.metadata["max_seq_len"] == 128
    want = brute_force(model, [prompts[0], prompts[2]], 0, 16)
    assert (lens.matrix(0) - want).abs().max() <= 1e-10 * want.abs().max()
    with pytest.raises(ValueError, match="no prompt has more than"):
        ri.fit_jacobian_lens(model, prompts[1:2], progress=False)
    # a (batch, pos) tensor is one prompt a row; max_seq_len truncates
    rows = torch.stack([prompts[0][:20], prompts[2][:20]])
    assert torch.equal(ri.fit_jacobian_lens(model, rows, max_seq_len=20, progress=False).jacobians,
                       ri.fit_jacobian_lens(model, [prompts[0], prompts[2]], max_seq_len=20, progress=False).jacobians)


def test_the_model_is_left_as_found():
    model = make_variant("LN", "standard", False)
    flags = [p.requires_grad for p in model.parameters()]
    ri.fit_jacobian_lens(model, _prompts(50), skip_first=2, progress=False)
    assert [p.requires_grad for p in model.parameters()] == flags and not model.training
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())


@pytest.mark.parametrize("variant", [("LN", "standard", False), ("RMS", "rotary", False, "gqa")], ids=variant_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_identity_lens_is_the_logit_lens_bit_for_bit(variant, dtype):
    model = make_variant(*variant, n_layers=3, dtype=dtype)
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(1))
    targets = ri.next_token_targets(tokens)
    identity = ri.JacobianLens(torch.eye(16, dtype=dtype).repeat(2, 1, 1), (0, 1), n_prompts=1)
    for kwargs in ({}, {"row_chunk": 7, "vocab_tile": 9, "batch_chunk": 2}, {"full": True}):
        got = ri.jacobian_lens(model, tokens, identity, targets=targets, k=4, **kwargs)
        want = ri.logit_lens(model, tokens, targets=targets, k=4, **kwargs)
        assert got.labels == want.labels and got.transported == (False, True, True, False)
        for name in ("top_tokens", "top_probs", "entropy", "target_probs", "log_probs"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None and b is None) or torch.equal(a.nan_to_num(), b.nan_to_num()), name


def test_the_readout_reads_the_transported_stream():
    """A point of the readout is the model's own readout of ``J h``, written out from the weights."""
    model = make_variant("LN", "standard", False, n_layers=3)
    tokens = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    lens = ri.fit_jacobian_lens(model, tokens, skip_first=2, progress=False)
    got = ri.jacobian_lens(model, tokens, lens, full=True)
    _, cache = model.run_with_cache(tokens)
    for i, layer in enumerate((0, 1)):
        y = cache[f"blocks.{layer}.hook_resid_post"] @ lens.matrix(layer).T
        y = torch.nn.functional.layer_norm(y, (16,), model.ln_final.w, model.ln_final.b, eps=model.cfg.eps)
        want = (y @ model.W_U + model.b_U).log_softmax(-1)
        assert (got.log_probs[1 + i] - want).abs().max() <= 1e-10
    assert (got.log_probs[-1] - model(tokens).log_softmax(-1)).abs().max() <= 1e-10
    assert got.top(2, position=3)[1][1][0][0] == int(got.top_tokens[1, 0, 3, 0])


# --- files ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fitted():
    model = make_variant("LN", "standard", False, n_layers=3)
    prompts = _prompts(50, (9, 8, 10, 7))
    return model, ri.fit_jacobian_lens(model, prompts, skip_first=2, corpus="random", progress=False)


def reference_save(path, J, n_prompts, d_model):
    """A lens file as the reference's ``JacobianLens.save`` writes it (jlens/lens.py): four keys, float16."""
    torch.save({"J": {layer: m.to(torch.float16) for layer, m in J.items()}, "n_prompts": n_prompts,
                "source_layers": sorted(J), "d_model": d_model}, path)


def reference_checkpoint(path, sums, n_done, next_idx, target_layer, skip_first):
    """A fit checkpoint as the reference's ``fit`` writes it (jlens/fitting.py's ``write_checkpoint``): six keys."""
    torch.save({"jacobian_sum": sums, "n_done": n_done, "next_idx": next_idx, "source_layers": sorted(sums),
                "target_layer": target_layer, "skip_first": skip_first}, path)


def test_a_file_round_trips(fitted, tmp_path):
    _, lens = fitted
    back = ri.JacobianLens.load(lens.save(tmp_path / "lens.pt"))
    assert torch.equal(back.jacobians, lens.jacobians.half().float())  # float16 by default, as the reference
    assert (back.source_layers, back.n_prompts, back.basis) == (lens.source_layers, 4, RAW)
    assert back.metadata == lens.metadata
    exact = ri.JacobianLens.load(lens.save(tmp_path / "lens64.pt", dtype=torch.float64))
    assert torch.equal(exact.jacobians, lens.jacobians)
    raw = torch.load(tmp_path / "lens.pt", weights_only=True)
    assert set(raw) == {"J", "n_prompts", "source_layers", "d_model", "metadata"} and raw["J"][0].dtype == torch.float16


def test_the_reference_files_load(tmp_path):
    J = {0: torch.randn(8, 8), 2: torch.randn(8, 8)}
    reference_save(tmp_path / "ref.pt", J, 5, 8)
    lens = ri.JacobianLens.load(tmp_path / "ref.pt")
    assert lens.source_layers == (0, 2) and lens.n_prompts == 5 and lens.metadata == {} and lens.basis == RAW
    assert torch.equal(lens.matrix(2), J[2].half().float())
    reference_checkpoint(tmp_path / "ckpt.pt", {l: 3 * m for l, m in J.items()}, 3, 4, 3, 16)
    lens = ri.JacobianLens.load(tmp_path / "ckpt.pt")
    assert lens.n_prompts == 3 and lens.metadata["target_layer"] == 3
    assert torch.allclose(lens.matrix(0), J[0], atol=1e-6)
    torch.save({"jacobian_sum": {0: J[0]}, "n_done": 0, "next_idx": 0}, tmp_path / "empty.pt")
    with pytest.raises(ValueError, match="no prompt done"):
        ri.JacobianLens.load(tmp_path / "empty.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="neither a Jacobian lens file"):
        ri.JacobianLens.load(tmp_path / "other.pt")


def test_merge_of_slices_is_one_fit(fitted):
    model, whole = fitted
    prompts = _prompts(50, (9, 8, 10, 7))
    parts = [ri.fit_jacobian_lens(model, p, skip_first=2, corpus="random", progress=False)
             for p in (prompts[:1], prompts[1:])]
    merged = ri.JacobianLens.merge(parts)
    assert merged.n_prompts == 4 and merged.metadata == whole.metadata
    assert (merged.jacobians - whole.jacobians).abs().max() <= 1e-13 * whole.jacobians.abs().max()
    other = ri.fit_jacobian_lens(model, prompts[:1], skip_first=3, corpus="random", progress=False)
    with pytest.raises(ValueError, match="provenance"):
        ri.JacobianLens.merge([parts[0], other])
    with pytest.raises(ValueError, match="at least one"):
        ri.JacobianLens.merge([])


def test_a_checkpointed_fit_resumes_where_it_stopped(fitted, tmp_path):
    model, whole = fitted
    prompts = _prompts(50, (9, 8, 10, 7))
    path = tmp_path / "fit.ckpt"
    ri.fit_jacobian_lens(model, prompts[:2], skip_first=2, corpus="random", checkpoint=path, progress=False)
    state = torch.load(path, weights_only=True)
    assert {"jacobian_sum", "n_done", "next_idx", "source_layers", "target_layer", "skip_first"} <= set(state)
    assert (state["n_done"], state["next_idx"], state["target_layer"]) == (2, 2, 2)
    resumed = ri.fit_jacobian_lens(model, prompts, skip_first=2, corpus="random", checkpoint=path, progress=False)
    assert (resumed.jacobians - whole.jacobians).abs().max() <= 1e-13 * whole.jacobians.abs().max()
    assert (ri.JacobianLens.load(path).jacobians - whole.jacobians).abs().max() <= 1e-13 * whole.jacobians.abs().max()
    with pytest.raises(ValueError, match="skip_first=2, not 3"):
        ri.fit_jacobian_lens(model, prompts, skip_first=3, checkpoint=path, progress=False)


@needs_tl43
def test_transformer_lens_reads_what_rs_interp_writes(fitted, tmp_path):
    from transformer_lens.tools.analysis import JacobianLens as TLLens

    _, lens = fitted
    theirs = TLLens.load(str(lens.save(tmp_path / "lens.pt")))
    assert theirs.source_layers == list(lens.source_layers) and theirs.n_prompts == 4 and theirs.d_model == 16
    assert all(torch.equal(theirs.jacobians[l], lens.matrix(l).half().float()) for l in lens.source_layers)
    assert theirs.metadata == lens.metadata
    ckpt = tmp_path / "fit.ckpt"
    ri.fit_jacobian_lens(fitted[0], _prompts(50, (9, 8, 10, 7)), skip_first=2, corpus="random", checkpoint=ckpt,
                         progress=False)
    from_ckpt = TLLens.load(str(ckpt))
    assert from_ckpt.n_prompts == 4
    assert all((from_ckpt.jacobians[l] - lens.matrix(l).float()).abs().max() <= 1e-6 for l in lens.source_layers)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    save_checkpoint("gpt2", folder)
    return folder


def _text(n, seed):
    g = torch.Generator().manual_seed(seed)
    return " ".join(f"t{int(i)}" for i in torch.randint(1, 299, (n,), generator=g))


@needs_tl43
def test_rs_interp_reads_what_transformer_lens_writes(gpt2_dir, tmp_path):
    """TransformerLens 4.3 fits on its raw bridge and saves; rs_interp loads the file, finds its own fit of the same
    checkpoint (float32 rounding apart), reads it on the raw model as TransformerLens does and maps it exactly onto
    the processed (centred) model."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import JacobianLens as TLLens

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers(str(gpt2_dir), device="cpu")
    bridge.eval()
    prompts = [_text(12, s) for s in range(3)]
    TLLens.fit(bridge, prompts, corpus="t", skip_first_positions=4, show_progress=False).save(str(tmp_path / "tl.pt"))
    theirs = ri.JacobianLens.load(tmp_path / "tl.pt")
    assert theirs.basis == RAW and theirs.metadata["transformer_lens_fit"] is True
    raw = ri.load_pretrained(gpt2_dir, fold_ln=False)
    ours = ri.fit_jacobian_lens(raw, prompts, skip_first=4, progress=False)
    assert (ours.jacobians - theirs.jacobians).abs().max() <= 2e-3 * ours.jacobians.abs().max()  # their float16 file
    readout = TLLens.load(str(tmp_path / "tl.pt")).readout(bridge, prompts[0], top_k=3)
    mine = ri.jacobian_lens(raw, raw.to_tokens(prompts[0]), theirs, k=3)
    theirs_top = torch.stack([readout.lens_topk_indices[l] for l in theirs.source_layers])
    assert torch.equal(mine.top_tokens[1:-1, 0], theirs_top)
    processed = ri.load_pretrained(gpt2_dir)  # fold_ln, center_writing_weights, center_unembed
    assert stream_basis(processed) == CENTRED
    own = ri.fit_jacobian_lens(processed, prompts, skip_first=4, progress=False)
    mapped = in_model_basis(ours, processed, "test")
    assert (mapped - own.jacobians).abs().max() <= 1e-4 * own.jacobians.abs().max()


# --- bases and refusals ------------------------------------------------------------------------------------------

def _centre_writes(model):
    """Every write into the stream made mean-free by hand (TransformerLens's center_writing_weights, on any norm)."""
    state = _backend.portable_state(model)
    for name, p in state.items():
        if name.endswith(("W_E", "W_pos", "W_O", "b_O", "W_out", "b_out")):
            state[name] = p - p.mean(-1, keepdim=True)
    _backend.load_portable_state(model, state)
    return model


def test_a_raw_lens_maps_exactly_onto_the_centred_stream():
    """Every write made mean-free in float64 (center_writing_weights, exactly): the lens fitted on the raw weights,
    mapped ``P J + (I - P)``, is the lens fitted on the centred ones; the readings agree through either."""
    raw = make_variant("LN", "standard", False, n_layers=3)
    centred = _centre_writes(make_variant("LN", "standard", False, n_layers=3))
    assert (stream_basis(raw), stream_basis(centred)) == (RAW, CENTRED)
    prompts = _prompts(50, (9, 8))
    lens = ri.fit_jacobian_lens(raw, prompts, skip_first=2, progress=False)
    own = ri.fit_jacobian_lens(centred, prompts, skip_first=2, progress=False)
    assert (lens.basis, own.basis) == (RAW, CENTRED)
    mapped = in_model_basis(lens, centred, "test")
    assert (mapped - own.jacobians).abs().max() <= 1e-10 * own.jacobians.abs().max()
    assert torch.equal(in_model_basis(own, centred, "test"), own.jacobians)
    tokens = torch.stack([p[:7] for p in prompts])
    a, b = ri.jacobian_lens(centred, tokens, lens, full=True), ri.jacobian_lens(raw, tokens, lens, full=True)
    assert (a.log_probs - b.log_probs).abs().max() <= 1e-10
    with pytest.raises(ValueError, match="fitted on a centred stream"):
        ri.jacobian_lens(raw, tokens, own)


def test_a_raw_lens_maps_onto_a_processed_checkpoint(gpt2_dir):
    """``load_pretrained``'s processing (fold_ln, center_writing_weights, center_unembed; 3.x processes in float32,
    4.x boots Hugging Face modules): the map holds to that processing's rounding."""
    prompts = [torch.randint(0, 299, (9,), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    raw = ri.load_pretrained(gpt2_dir, fold_ln=False, dtype=torch.float64)
    processed = ri.load_pretrained(gpt2_dir, dtype=torch.float64)
    assert (stream_basis(raw), stream_basis(processed)) == (RAW, CENTRED)
    lens = ri.fit_jacobian_lens(raw, prompts, skip_first=2, progress=False)
    own = ri.fit_jacobian_lens(processed, prompts, skip_first=2, progress=False)
    assert (in_model_basis(lens, processed, "test") - own.jacobians).abs().max() <= 1e-6 * own.jacobians.abs().max()
    tokens = torch.stack(prompts)
    a, b = ri.jacobian_lens(processed, tokens, lens, full=True), ri.jacobian_lens(raw, tokens, lens, full=True)
    assert (a.log_probs - b.log_probs).abs().max() <= 1e-6


def test_a_raw_lens_on_a_centred_stream_read_by_rms_norms_is_refused():
    model = make_variant("RMS", "standard", False)
    lens = ri.fit_jacobian_lens(model, _prompts(50), skip_first=2, progress=False)
    _centre_writes(model)
    assert stream_basis(model) == CENTRED
    with pytest.raises(ValueError, match="not every reader of the stream subtracts its mean"):
        ri.jacobian_lens(model, torch.zeros(1, 4, dtype=torch.long), lens)


def test_a_lens_of_another_model_is_refused(fitted):
    model, lens = fitted
    tokens = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="d_model=8"):
        ri.jacobian_lens(model, tokens, ri.JacobianLens(torch.zeros(1, 8, 8), (0,), n_prompts=1))
    with pytest.raises(ValueError, match="source layers"):
        ri.jacobian_lens(model, tokens, ri.JacobianLens(torch.zeros(1, 16, 16), (2,), n_prompts=1))
    with pytest.raises(ValueError, match="to layer 5"):
        ri.jacobian_lens(model, tokens, ri.JacobianLens(torch.zeros(1, 16, 16), (0,), 1, {"target_layer": 5}))


def test_bidirectional_attention_is_refused_by_name():
    model = ri.load_toy_model("tracr-reverse")
    with pytest.raises(ValueError, match="fit_jacobian_lens refuses this model: bidirectional attention"):
        ri.fit_jacobian_lens(model, torch.zeros(1, 4, dtype=torch.long), progress=False)
