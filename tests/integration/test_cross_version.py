"""Issue 14: one checkpoint format, and the same numbers under TransformerLens 3.x and 4.x.

``scripts/test.sh`` runs the suite under 3.x and 4.x side by side, with ``RS_INTERP_CROSS_DIR`` naming a
directory both runs share: each run records what the helpers compute on fresh inputs there, and the
one that finds the other's record compares its numbers with it (1e-3 in float32, 1e-9 where a helper
computes in float64). See ``conftest.other_version_record``. Run under one version alone, the comparison is skipped and says why.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from tests.builders import other_version_record

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"


@pytest.mark.parametrize("saved_by", ["tl3", "tl4"])
def test_a_checkpoint_saved_under_either_version_loads_under_this_one(saved_by):
    """``induction-1l`` re-saved by each version (tests/data) is the shipped model, weight for weight."""
    shipped = ri.load_toy_model("induction-1l")
    other = ri.models.load_model(DATA / f"induction-1l-{saved_by}")
    a, b = _backend.portable_state(shipped), _backend.portable_state(other)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # a permutation and reshapes: exact
    toks = ri.induction_batch(4, seed=11).tokens
    with torch.no_grad():
        assert torch.equal(shipped(toks), other(toks))


def test_save_then_load_round_trips_exactly(tmp_path):
    model = ri.load_toy_model("induction-2l")
    again = ri.models.load_model(ri.models.save_model(model, tmp_path / "m"))
    toks = ri.induction_batch(2, seed=12).tokens
    with torch.no_grad():
        assert torch.equal(model(toks), again(toks))
    assert type(again) is type(model) is _backend.Model


def test_the_same_seed_gives_the_same_random_model_under_both_versions():
    """4.x initialises in HookedTransformer's order from the same RNG: recorded numbers check it."""
    state = _backend.portable_state(ri.models.make_attn_only(2, seed=5))
    assert state["blocks.0.attn.b_V"].abs().max() == 0 and float(state["embed.W_E"].std()) == pytest.approx(0.8 / 32 ** 0.5, rel=0.05)


def _hf_gpt2_dir() -> str:
    """A random Hugging Face GPT-2 (two layers), the same under both environments (same transformers)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tempfile.mkdtemp(prefix="rs_interp_cross_")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64))
    hf.save_pretrained(path)
    return path


def _numbers() -> dict[str, torch.Tensor]:
    """What the helpers compute on inputs no other test uses."""
    out: dict[str, torch.Tensor] = {}
    toy, toy1 = ri.load_toy_model("induction-2l"), ri.load_toy_model("induction-1l")
    toy64 = ri.as_dtype(toy, torch.float64)
    batch = ri.induction_batch(6, seed=2024)
    toks = batch.tokens
    nxt = ri.next_token_targets(toks)  # -1 at the last position (skipped)
    with torch.no_grad():
        out["toy2 logits"], out["toy1 logits"] = toy(toks), toy1(toks)
    for kind in "qkv":
        out[f"toy2 composition {kind}"] = ri.composition_scores(toy, kind).scores
    ph = int(ri.prev_token_scores(toy, toks)[0].argmax())
    out["toy2 key input"] = ri.run_with_key_input(toy, toks, layer=1, keep=[(0, ph)])
    out["toy2 query input"] = ri.run_with_query_input(toy, toks, layer=1)
    out["toy2 paths f64"] = ri.path_expansion(toy64, toks, targets=nxt).contributions
    out["toy2 lens"] = ri.logit_lens(toy, toks, targets=nxt).target_probs
    out["toy2 dla f64"] = ri.direct_logit_attribution(toy64, toks, targets=nxt).contributions
    gpt2 = ri.load_gpt2(_hf_gpt2_dir(), fold_ln=True)
    g = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        out["gpt2 logits"] = gpt2(g)
    dla = ri.direct_logit_attribution(gpt2, g, targets=ri.next_token_targets(g))
    # 3.x's fold_ln folds ln_final's bias into b_U; 4.x's bridge keeps it as its own term: compare the sum.
    rows = dict(zip(dla.labels, dla.contributions))
    if "ln_final.b" in rows:
        rows["b_U"] = rows["b_U"] + rows.pop("ln_final.b")
    out["gpt2 dla"] = torch.stack(list(rows.values()))
    second = ri.second_order_attribution(gpt2, g[:1], targets=ri.next_token_targets(g[:1]), positions=[-2])
    # Likewise 3.x folds ln1's bias into b_V; 4.x's bridge keeps it as a source of its own: compare the sum.
    rows = dict(zip(second.sources, second.contributions))
    if "ln1.b" in rows:
        rows["b_V"] = rows["b_V"] + rows.pop("ln1.b")
    out["gpt2 second order"] = torch.stack(list(rows.values()))
    metric = lambda logits: logits[:, -1].log_softmax(-1)[:, 3].mean()  # noqa: E731
    out["gpt2 attribution patching"] = ri.attribution_patching(gpt2, g, metric, reference=g.flip(1)).effect
    return {k: v.detach().cpu() for k, v in out.items()}


@pytest.mark.cross_version
def test_numbers_match_the_other_version():
    mine = _numbers()
    theirs = other_version_record("numbers", mine)
    assert mine.keys() == theirs.keys()
    for k in mine:
        a, b = mine[k], theirs[k]
        assert a.shape == b.shape, k
        tol = 1e-9 if a.dtype == torch.float64 else 1e-3
        finite = a.isfinite()
        assert torch.equal(finite, b.isfinite()), k
        gap = float((a[finite].double() - b[finite].double()).abs().max()) if finite.any() else 0.0
        assert gap <= tol, f"{k}: 3.x and 4.x differ by {gap:.3g} (tolerance {tol:g})"
