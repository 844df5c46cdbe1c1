import json

import pytest
import torch

import rs_interp as ri
from rs_interp.models.checkpoints import read_metadata
from rs_interp.models.registry import SHIPPED_MODELS, toy_model_path


def test_config_is_the_theorys_model():
    cfg = ri.models.attn_only_config()
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_vocab, cfg.n_ctx) == (2, 32, 2, 16, 256, 48)
    assert cfg.attn_only and cfg.normalization_type is None
    assert cfg.positional_embedding_type == "rotary" and cfg.rotary_dim == cfg.d_head
    assert cfg.attention_dir == "causal"


def test_overrides_apply():
    cfg = ri.models.attn_only_config(3, d_vocab=64, n_ctx=20)
    assert (cfg.n_layers, cfg.d_vocab, cfg.n_ctx) == (3, 64, 20)


@pytest.mark.parametrize("n_layers", [0, -1])
def test_bad_n_layers(n_layers):
    with pytest.raises(ValueError, match="n_layers"):
        ri.models.attn_only_config(n_layers)
    with pytest.raises(ValueError, match="n_layers"):
        ri.models.make_attn_only(n_layers)


def test_make_is_seeded_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = ri.models.make_attn_only(2, seed=4), ri.models.make_attn_only(2, seed=4), ri.models.make_attn_only(2, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.W_E, c.W_E)


@pytest.mark.parametrize("name", ["b_V", "b_O", "b_U"])
def test_untrained_biases_are_zero(name, toy2):
    fresh = ri.models.make_attn_only(2)
    assert not getattr(fresh, name).any()
    assert not getattr(toy2, name).any(), "training must leave the theory's absent biases at zero"


def test_query_key_biases_are_trained(toy2):
    assert toy2.b_Q.abs().max() > 0.1 and toy2.b_K.abs().max() > 0.1


def test_logits_are_exactly_resid_times_unembed(toy2, small_batch):
    logits, cache = toy2.run_with_cache(small_batch.tokens)
    assert torch.allclose(logits, cache["blocks.1.hook_resid_post"] @ toy2.W_U, atol=1e-5, rtol=0)


def test_save_load_roundtrip(tmp_path, toy2, small_batch):
    path = ri.models.save_model(toy2, tmp_path / "m", metadata={"note": "x"})
    assert (tmp_path / "m.json").is_file() and (tmp_path / "m.safetensors").is_file()
    loaded = ri.models.load_model(path)
    assert torch.equal(loaded(small_batch.tokens), toy2(small_batch.tokens))
    assert read_metadata(path) == {"note": "x", "versions": ri.models.checkpoints.made_with()}
    assert json.loads((tmp_path / "m.json").read_text())["config"]["d_model"] == 32


def test_as_dtype_copies(toy2, small_batch):
    m64 = ri.as_dtype(toy2, torch.float64)
    assert toy2.W_E.dtype == torch.float32 and m64.W_E.dtype == torch.float64
    diff = (m64(small_batch.tokens) - toy2(small_batch.tokens).double()).abs().max()
    assert diff < 1e-4


@pytest.mark.parametrize("name,n_layers", [("induction-2l", 2), ("induction-1l", 1)])
def test_shipped_models_record_their_training(name, n_layers):
    meta = read_metadata(toy_model_path(name))
    assert meta["training"]["n_layers"] == n_layers and meta["training"]["steps"] == 1000
    assert "seed" in meta["training"] and "test_loss" in meta


@pytest.mark.parametrize("name", sorted(SHIPPED_MODELS))
def test_the_registry_describes_every_shipped_checkpoint(name):
    """Each entry's recipe is the one recorded beside its checkpoint, its extra files ship with it,
    its tolerance names recorded metrics, and the metadata says which versions made it."""
    entry = SHIPPED_MODELS[name]
    meta = entry.metadata()
    assert {k: meta["training"][k] for k in entry.settings} == dict(entry.settings)
    assert set(entry.tolerance) <= set(meta)
    assert {"torch", "transformer_lens"} <= set(meta["versions"])
    for suffix in entry.extra_files:
        assert entry.path.with_name(name + suffix).is_file()


def test_every_shipped_checkpoint_is_in_the_registry():
    import pathlib

    folder = pathlib.Path(ri.__file__).parent / "toy_models"
    assert {p.name.removesuffix(".safetensors") for p in folder.glob("*.safetensors")} == set(SHIPPED_MODELS)


def test_unknown_toy_model():
    with pytest.raises(ValueError, match="name"):
        ri.load_toy_model("induction-3l")


def test_model_construction_silences_only_the_hookedtransformer_deprecation():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ri.models.make_attn_only(1)
        warnings.warn("an unrelated deprecation", DeprecationWarning)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert not any("HookedTransformer is deprecated" in m for m in messages)
    assert "an unrelated deprecation" in messages  # the filter is scoped to construction
