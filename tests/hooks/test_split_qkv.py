"""rs_interp.hooks.split_qkv_inputs: a user's own hook_{q,k,v}_input hooks give the same logits on
TransformerLens 3.x and 4.x (issue 28 item 5), and the user's hooks on attn.hook_{q,k,v} and ln1
are honoured on 4.x's emulated inputs as on 3.x (issue 29 item 4).

Brute force, written apart from the emulation: a per-head input edit of head h at layer L gives
head h the projection the model itself computes when its whole stream at layer L is the edited
value; so run the model with ``hook_resid_pre`` replaced, record ``attn.hook_{q,k,v}``, and put
head h's slice into a normal run at the same hook. On 3.x, TransformerLens's own
``use_split_qkv_input`` is a second brute force, and its numbers are recorded for the 4.x run
(``RS_INTERP_CROSS_DIR``, as in tests/integration/test_cross_version.py). Float64 throughout; tolerance 1e-10.
"""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.hooks import split_qkv_inputs
from tests.builders import TL4, make_variant, other_version_record

TOL = 1e-10


def _same_weights(model, seed):
    """Every parameter drawn from one generator in name order: the same model under both versions
    (portable names and shapes are shared), whatever each version's initialisation does."""
    g, state = torch.Generator().manual_seed(seed), _backend.portable_state(model)
    for name in sorted(state):
        leaf, shape = name.rsplit(".", 1)[-1], state[name].shape
        if leaf == "w":
            state[name] = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
        elif leaf == "b_U":
            state[name] = torch.zeros(shape, dtype=torch.float64)  # zero, as builders.perturb leaves it on 4.x
        else:
            state[name] = (0.2 if leaf.startswith("b") else 0.3) * torch.randn(shape, generator=g, dtype=torch.float64)
    _backend.load_portable_state(model, state)
    return model.eval()


def _models():
    return {"attn-rotary": _same_weights(ri.models.make_attn_only(2, seed=3, dtype=torch.float64), 3),
            "ln-standard-mlp": _same_weights(make_variant("LN", "standard", False, seed=1), 1),
            "rms-rotary-attn": _same_weights(make_variant("RMS", "rotary", True, seed=2), 2)}


@pytest.fixture(scope="module")
def models():
    return _models()


def _tokens(model, seed=0):
    return torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(seed))


def _edit(model, seed):
    """A replacement stream for one head's input (batch, pos, d_model)."""
    return torch.randn(2, 7, model.cfg.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _put(value, head):
    """A per-head input hook: head ``head``'s input becomes ``value``."""
    def fn(t, *, hook):
        assert t.ndim == 4 and t.shape[2] == hook_heads(hook.name), hook.name
        out = t.clone()
        out[:, :, head] = value
        return out
    return fn


def hook_heads(name):
    return 2  # every model here has two heads


def _k_shift(t, *, hook):
    """A user's own hook on attn.hook_k: shift head 1's keys."""
    out = t.clone()
    out[:, :, 1] += 0.3
    return out


def _ln_double(t, *, hook):
    """A user's own hook on ln1.hook_normalized."""
    return 2 * t


#: (per-head input edits as (layer, q/k/v, head, seed)), extra hooks applied outside, extra hooks inside
SCENARIOS = {
    "q": ([(1, "q", 0, 10)], [], []),
    "k": ([(1, "k", 1, 11)], [], []),
    "v": ([(0, "v", 0, 12)], [], []),
    "qkv": ([(1, "q", 1, 13), (1, "k", 0, 14), (1, "v", 1, 15)], [], []),
    "k + outer hook_k": ([(1, "k", 0, 16)], [("blocks.1.attn.hook_k", _k_shift)], []),
    "k + inner hook_k": ([(1, "k", 0, 17)], [], [("blocks.1.attn.hook_k", _k_shift)]),
    "q + ln1 hook": ([(1, "q", 0, 18)], [], [("blocks.1.ln1.hook_normalized", _ln_double)]),
}


def _input_hooks(model, edits):
    return [(f"blocks.{l}.hook_{w}_input", _put(_edit(model, s), h)) for l, w, h, s in edits]


def _ln_ok(model, outer, inner):
    return model.cfg.normalization_type is not None or not any("ln1" in n for n, _ in outer + inner)


def run_split(model, tokens, scenario):
    edits, outer, inner = SCENARIOS[scenario]
    with torch.no_grad(), model.hooks(fwd_hooks=outer), split_qkv_inputs(model, _input_hooks(model, edits) + inner):
        return model(tokens)


def brute_force(model, tokens, scenario):
    """The edits through the model's own forward passes and ordinary hooks only."""
    edits, outer, inner = SCENARIOS[scenario]
    user = outer + inner
    replace: dict[tuple[int, str], list[tuple[int, torch.Tensor]]] = {}
    with torch.no_grad():
        for l, w, h, s in edits:
            box = {}
            record = lambda t, *, hook: box.__setitem__("p", t.clone())  # noqa: E731
            swap = lambda t, *, hook, v=_edit(model, s): v.clone()  # noqa: E731
            # The user's ln1 hooks act on the edited input too; their hook_{q,k,v} hooks come after.
            ln = [(n, f) for n, f in user if "ln1" in n]
            with model.hooks(fwd_hooks=[(f"blocks.{l}.hook_resid_pre", swap), (f"blocks.{l}.attn.hook_{w}", record)] + ln):
                model(tokens)
            replace.setdefault((l, w), []).append((h, box["p"][:, :, h]))

        def put_all(slices):
            def fn(t, *, hook):
                out = t.clone()
                for h, p in slices:
                    out[:, :, h] = p
                return out
            return fn

        first = [(f"blocks.{l}.attn.hook_{w}", put_all(sl)) for (l, w), sl in replace.items()]
        with model.hooks(fwd_hooks=first + user):
            return model(tokens)


def tl3_own(model, tokens, scenario):
    """TransformerLens 3.x's own split inputs, the flag set by hand."""
    edits, outer, inner = SCENARIOS[scenario]
    model.cfg.use_split_qkv_input = True
    try:
        with torch.no_grad(), model.hooks(fwd_hooks=outer), model.hooks(fwd_hooks=_input_hooks(model, edits) + inner):
            return model(tokens)
    finally:
        model.cfg.use_split_qkv_input = False


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("name", ["attn-rotary", "ln-standard-mlp", "rms-rotary-attn"])
def test_split_inputs_equal_the_brute_force(models, name, scenario):
    model = models[name]
    edits, outer, inner = SCENARIOS[scenario]
    if not _ln_ok(model, outer, inner):
        pytest.skip("no ln1 on a model without normalisation")
    tokens = _tokens(model)
    clean = model(tokens)
    got, want = run_split(model, tokens, scenario), brute_force(model, tokens, scenario)
    assert (got - clean).abs().max() > 1e-3  # the edit matters
    assert (got - want).abs().max() < TOL
    assert not model.cfg.use_split_qkv_input and (model(tokens) - clean).abs().max() == 0  # nothing left behind
    if not TL4:
        assert (got - tl3_own(model, tokens, scenario)).abs().max() < TOL


def test_a_name_filter_reaches_the_per_head_inputs(models):
    model, seen = models["attn-rotary"], []
    tokens = _tokens(model)

    def zero(t, *, hook):
        seen.append((hook.name, tuple(t.shape)))
        return torch.zeros_like(t)

    with torch.no_grad(), split_qkv_inputs(model, [(lambda n: n.endswith("hook_k_input"), zero)]):
        by_filter = model(tokens)
    with torch.no_grad(), split_qkv_inputs(model, [(f"blocks.{l}.hook_k_input", zero) for l in range(2)]):
        by_name = model(tokens)
    assert torch.equal(by_filter, by_name) and (by_filter - model(tokens)).abs().max() > 1e-3
    assert sorted(set(seen)) == [(f"blocks.{l}.hook_k_input", (2, 7, 2, 32)) for l in range(2)]


def test_the_flag_goes_through_the_models_setter(models, monkeypatch):
    """On 3.x (and 4.x bridges with the split inputs) ``set_use_split_qkv_input``; native 4.x emulates."""
    model, calls = models["attn-rotary"], []
    setter = model.set_use_split_qkv_input
    monkeypatch.setattr(model, "set_use_split_qkv_input", lambda v: (calls.append(v), setter(v))[1], raising=False)
    with split_qkv_inputs(model, [("blocks.1.hook_q_input", lambda t, *, hook: None)]):
        during = bool(model.cfg.use_split_qkv_input)
    assert calls == ([] if TL4 else [True, False]) and during == (not TL4) and not model.cfg.use_split_qkv_input


@pytest.mark.cross_version
def test_same_logits_as_the_other_version():
    """The 3.x run records TransformerLens's own split-input logits; the 4.x run compares."""
    mine = {}
    for name, model in _models().items():
        tokens = _tokens(model, seed=5)
        for scenario, (edits, outer, inner) in SCENARIOS.items():
            if _ln_ok(model, outer, inner):
                mine[f"{name} {scenario}"] = (tl3_own if not TL4 else run_split)(model, tokens, scenario)
    theirs = other_version_record("split_qkv", mine)
    assert mine.keys() == theirs.keys()
    for k in mine:
        gap = float((mine[k] - theirs[k]).abs().max())
        assert gap < TOL, f"{k}: 3.x and 4.x differ by {gap:.3g}"


# --- the removal conditions of the 4.x emulations: each test fails once TransformerLens meets it ----

needs_tl4 = pytest.mark.skipif(not TL4, reason="the emulations exist on TransformerLens 4.x only")


@needs_tl4
def test_native_attention_still_lacks_split_inputs(models):
    model = models["attn-rotary"]
    assert _backend.projection_layers(model) == {0, 1}  # native attention on both layers
    with pytest.raises(NotImplementedError):
        model.set_use_split_qkv_input(True)  # once this works, emulation.qkv_input_hooks can go
    model.set_use_split_qkv_input(False)


@needs_tl4
def test_native_hook_attn_scores_still_holds_the_pattern(models):
    model, box = models["attn-rotary"], {}
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", lambda t, *, hook: box.__setitem__("s", t))]):
        model(_tokens(model))
    # once these are scores (rows not summing to 1), emulation.score_hooks can go
    assert torch.allclose(box["s"].sum(-1), torch.ones((), dtype=torch.float64))


@needs_tl4
def test_stop_at_the_last_layer_still_returns_logits(models):
    model = models["attn-rotary"]
    with torch.no_grad():
        out = model(_tokens(model), stop_at_layer=model.cfg.n_layers)
    assert out.shape[-1] == model.cfg.d_vocab  # once it is d_model, emulation.final_stream can go


@needs_tl4
def test_hf_attention_uses_transformerlens_own_inputs_through_the_setter():
    """A bridge over Hugging Face GPT-2 attention: recognised per layer as having the split inputs;
    the setter sets every block's attention config for the duration."""
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel

    path = tempfile.mkdtemp(prefix="rs_interp_split_")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=16)).save_pretrained(path)
    model = ri.load_gpt2(path, fold_ln=False)
    impl = _backend._impl
    assert impl.has_split_inputs(model, 0) and not impl.is_native_attention(model, 0)
    seen = {}

    def look(t, *, hook):
        seen["shape"] = tuple(t.shape)
        seen["attn cfg"] = bool(model.blocks[0].attn.config.use_split_qkv_input)

    with torch.no_grad(), split_qkv_inputs(model, [("blocks.0.hook_q_input", look)]):
        model(torch.zeros(1, 5, dtype=torch.long))
    assert seen == {"shape": (1, 5, 2, 32), "attn cfg": True}
    assert not model.cfg.use_split_qkv_input and not model.blocks[0].attn.config.use_split_qkv_input
