"""GPT-2: the offline conversion path, residual identities, and every helper at GPT-2 shape.

Tests that need the real weights run where ``RS_INTERP_GPT2_PATH`` names a local checkpoint
directory or the Hugging Face cache holds ``gpt2``; elsewhere they skip and say how to provide them.
"""

import os
import subprocess
import sys

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import rs_interp as ri
from rs_interp.models.gpt2 import ENV_VAR, GPT2WeightsUnavailable, find_pretrained_gpt2
from rs_interp.reproduce.gpt2_check import analyse_gpt2


@pytest.fixture(scope="module")
def hf_random():
    """A random-weight GPT-2 small saved as a Hugging Face checkpoint directory."""
    import tempfile

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = GPT2LMHeadModel(GPT2Config()).eval()
    d = tempfile.mkdtemp(prefix="rs_interp_gpt2_")
    hf.save_pretrained(d)
    return hf, d


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("fold_ln", [True, False])
def test_conversion_matches_huggingface(hf_random, tokens, fold_ln):
    hf, path = hf_random
    model = ri.load_gpt2(path, fold_ln=fold_ln)
    if fold_ln:  # folded: 3.x says LNPre; 4.x keeps "LN" with unit gains and zero biases, the same function
        ln = model.ln_final
        assert model.cfg.normalization_type == "LNPre" or (bool((ln.w == 1).all()) and not bool(ln.b.any()))
    else:
        assert model.cfg.normalization_type == "LN"
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    diff = ((ours - ours.mean(-1, keepdim=True)) - (theirs - theirs.mean(-1, keepdim=True))).abs().max()
    assert diff <= 1e-4


@pytest.fixture(scope="module")
def gpt2_unfolded(hf_random):
    return ri.load_gpt2(hf_random[1], fold_ln=False)


def test_decompose_resid_sums_to_final_stream(gpt2_unfolded, tokens):
    _, cache = gpt2_unfolded.run_with_cache(tokens)
    parts = cache.decompose_resid(apply_ln=False)
    assert (parts.sum(0) - cache["blocks.11.hook_resid_post"]).abs().max() <= 1e-3


def test_last_lens_reading_is_the_output(gpt2_unfolded, tokens):
    lens = ri.logit_lens(gpt2_unfolded, tokens, full=True)
    assert len(lens.labels) == 13
    lp = gpt2_unfolded(tokens).log_softmax(-1)
    assert (lens.log_probs[-1] - lp).abs().max() <= 1e-5


@pytest.mark.parametrize("layer", [0, 5, 11])
def test_constant_vector_before_a_block_changes_nothing(gpt2_unfolded, tokens, layer):
    """LayerNorm removes c·1: adding it to the stream before any block leaves the logits unchanged."""
    clean = gpt2_unfolded(tokens)
    c = 3.7 * torch.ones(gpt2_unfolded.cfg.d_model)
    with gpt2_unfolded.hooks(fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", ri.hooks.add(c))]):
        shifted = gpt2_unfolded(tokens)
    assert (shifted - clean).abs().max() <= 1e-3
    with gpt2_unfolded.hooks(fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", ri.hooks.add(c * torch.randn(768)))]):
        moved = gpt2_unfolded(tokens)
    assert (moved - clean).abs().max() > 1e-2  # a non-constant vector does move them


def test_bad_sources_say_how_to_provide_weights(tmp_path):
    with pytest.raises(GPT2WeightsUnavailable, match=ENV_VAR):
        ri.load_gpt2(tmp_path / "nowhere")
    with pytest.raises(GPT2WeightsUnavailable, match="config.json"):
        ri.load_gpt2(tmp_path)
    with pytest.raises(ValueError, match="size"):
        ri.load_gpt2("random", size="huge")


def test_hub_offline_fails_fast_and_clearly():
    code = ("from rs_interp.models.gpt2 import load_gpt2, GPT2WeightsUnavailable\n"
            "try:\n    load_gpt2('hub'); print('LOADED')\n"
            "except GPT2WeightsUnavailable as e:\n    print('UNAVAILABLE', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if "LOADED" in r.stdout:
        pytest.skip("the Hugging Face cache holds gpt2 here")
    assert "UNAVAILABLE" in r.stdout and ENV_VAR in r.stdout, r.stderr[-2000:]


# ---- every helper on a GPT-2-small-shaped model (random weights) -------------------------------


@pytest.fixture(scope="module")
def gpt2_random():
    return ri.load_gpt2("random")


def test_composition_scores_over_144_heads(gpt2_random):
    for kind in "kqv":
        s = ri.composition_scores(gpt2_random, kind).scores
        assert s.shape == (12, 12, 12, 12)
        assert (~s.isnan()).sum() == 66 * 144
    full = ri.composition_scores(gpt2_random, "k", full_circuit=True).scores
    # TransformerLens's own score on a spread of head pairs (its all_composition_scores forms all
    # 20,736 products: 18 s of the suite for the same check)
    from transformer_lens.utilities import composition_scores

    OV, QK = gpt2_random.OV, gpt2_random.QK
    pairs = [(l1, (5 * l1) % 12, l2, (7 * l2 + l1) % 12) for l1 in range(11) for l2 in (l1 + 1, 11)]
    theirs = torch.stack([composition_scores(OV[l1, h1], QK[l2, h2].T) for l1, h1, l2, h2 in pairs])
    ours = torch.stack([full[l1, h1, l2, h2] for l1, h1, l2, h2 in pairs])
    assert (ours - theirs).abs().max() <= 1e-5


def test_key_and_query_ablation_on_gpt2(gpt2_random, tokens):
    clean = gpt2_random(tokens)
    keep_all = [(l, h) for l in range(5) for h in range(12)]
    for fn in (ri.run_with_key_input, ri.run_with_query_input):
        # x_0 plus every earlier head's write misses only the attention biases and MLPs: it moves
        moved = fn(gpt2_random, tokens, layer=5, keep=keep_all[:3])
        assert moved.shape == clean.shape and (moved - clean).abs().max() > 1e-4


def test_dla_on_gpt2(gpt2_random, tokens):
    dla = ri.direct_logit_attribution(gpt2_random, tokens, targets=ri.next_token_targets(tokens))
    ln_bias = gpt2_random.cfg.normalization_type == "LN"  # random weights keep LayerNorm explicit
    assert len(dla.labels) == 1 + 1 + 144 + 12 + 12 + ln_bias + 1  # embeds, heads, attn biases, MLPs, LN bias, b_U
    assert (dla.total() - dla.per_position).abs().max() <= 1e-4


def test_head_roles_on_gpt2(gpt2_random):
    a = analyse_gpt2(gpt2_random, weights="random", n_sequences=2, period=20)
    assert a.prev_token.shape == (12, 12) and a.induction.shape == (12, 12)
    assert len(a.top_induction) == 10
    # random weights carry GPT-2's real tokenizer (issue 43): the lens runs on the prompt, the answer is " Paris"
    assert a.prompt == "The Eiffel Tower is in the city of" and a.prompt_answer == " Paris" and len(a.lens_p_answer) == 13


# ---- the real weights, where they are present -----------------------------------------------------


@pytest.fixture(scope="module")
def pretrained():
    model, _ = find_pretrained_gpt2()
    if model is None:
        pytest.skip(f"needs pretrained GPT-2 small, absent here: set {ENV_VAR}=DIR, a local Hugging Face checkpoint "
                    "directory (config.json, model.safetensors, tokenizer files; see the docs' page 'GPT-2 and loading models' "
                    "(docs/capabilities/models.md)), or put "
                    "'gpt2' in the Hugging Face cache")
    return model


def test_paris(pretrained):
    a = analyse_gpt2(pretrained, weights="pretrained")
    assert a.final_top_token == " Paris"
    assert len(a.lens_p_answer) == 13 and a.lens_p_answer[-1] > a.lens_p_answer[0]


def test_known_induction_and_prev_token_heads(pretrained):
    a = analyse_gpt2(pretrained, weights="pretrained")
    for head in ("L5H1", "L5H5", "L6H9", "L7H2", "L7H10"):
        assert head in a.top_induction, (head, a.top_induction)
    assert "L4H11" in a.top_prev_token


def test_pretrained_parameter_count(pretrained):
    assert ri.count_parameters(pretrained).total == 124_439_808


def test_cli_gpt2_says_which_weights(hf_random, tmp_path, capsys, monkeypatch):
    from rs_interp.reproduce import gpt2_check
    from rs_interp.ui.cli import main

    analyses = []  # (weights, source) of each run, and its analysis
    def recorded(model, **kwargs):
        analyses.append((kwargs["weights"], kwargs["source"], analyse(model, **kwargs)))
        return analyses[-1][2]

    analyse = gpt2_check.analyse_gpt2
    monkeypatch.setattr(gpt2_check, "analyse_gpt2", recorded)
    assert main(["gpt2", "--weights", hf_random[1], "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"pretrained weights from {hf_random[1]}" in out and "124,439,808" in out
    assert (tmp_path / "gpt2.json").is_file()
    # The random-weights run: what it loads and says; its analysis (the report's gpt2 section runs it
    # on random weights, tests/reproduce/test_report.py) is replaced by the first run's to spare a GPT-2 pass.
    analyse = lambda model, **kwargs: analyses[0][2]  # noqa: E731
    assert main(["gpt2", "--weights", "random"]) == 0
    assert "random weights" in capsys.readouterr().out
    assert [a[:2] for a in analyses] == [("pretrained", f"pretrained weights from {hf_random[1]}"),
                                          ("random", "random initialisation")]
