"""Issue 40: the certificate names what breaks. On a working model every identity holds; each mutation
below breaks one identity the way a real model or conversion does (a hook off the forward path, a norm
after a sublayer, a step that running from a layer skips, a soft-cap after the unembedding, a dropped
bias in a conversion), and the certificate names it, and the helpers that need it refuse by name.

The mutations are plain PyTorch: a hook point replaced in its parent module by a wrapper that calls it
and then uses something else, and module hooks; nothing of rs_interp's."""

from __future__ import annotations

import pytest
import torch
from builders import make_variant

import rs_interp as ri
from rs_interp import _backend
from rs_interp.certificate import IDENTITIES


def _model():
    return make_variant("LN", "standard", False, n_layers=2)


class _Wrapped(torch.nn.Module):
    """Calls the hook point (its hooks run), then passes on ``after(output, input)``."""

    def __init__(self, point, after):
        super().__init__()
        self.point, self.after = point, after

    def forward(self, x, *args, **kwargs):
        return self.after(self.point(x, *args, **kwargs), x)


def _wrap(model, name, after):
    """Replace hook point ``name`` where its parent module calls it (found by identity)."""
    point = model.hook_dict[name]
    for module in model.modules():
        for attr, child in list(module._modules.items()):
            if child is point and not isinstance(module, _Wrapped):
                module._modules[attr] = _Wrapped(point, after)
                return
    raise AssertionError(f"no parent calls {name}")


OFF_PATH = lambda out, x: x  # noqa: E731  (the hook's output is dropped: the hook is off the forward path)
DOUBLED = lambda out, x: 2 * out  # noqa: E731  (something after the hook changes what flows on)


def test_every_identity_holds_on_a_working_model():
    cert = ri.certify(_model())
    assert cert.failed() == () and [i.name for i in cert.identities] == list(IDENTITIES)
    assert all(i.gap <= i.tolerance for i in cert.identities if i.holds)
    assert "readers" in cert.table() and "edge_attribution_patching" in cert.table()


def _mlp_in_off_path(model):
    _backend.set_flag(model, "use_hook_mlp_in", True)
    _wrap(model, "blocks.1.hook_mlp_in", OFF_PATH)


def _start_skips_a_step(model):
    """The full run changes layer 1's attention pattern in a way a run from layer 1 does not (as 4.3 drops
    BLOOM's alibi bias there): flagged by the embedding, which a run from a layer skips."""
    seen = {}
    model.embed.register_forward_hook(lambda mod, args, out: seen.update(full=True))
    _wrap(model, "blocks.1.attn.hook_pattern", lambda out, x: out.tril() * 0.5 if seen.pop("full", False) else out)


def _softcap_after_unembedding(model):
    model.unembed.register_forward_hook(lambda mod, args, out: 3.0 * torch.tanh(out / 3.0))


MUTATIONS = {
    # identity: (what is done, which identity must fail, a helper that must refuse naming it)
    "mlp_in off path": (_mlp_in_off_path, "readers", "edge_attribution_patching"),
    "z off path": (lambda m: _wrap(m, "blocks.0.attn.hook_z", OFF_PATH), "z", "attribution_patching"),
    "norm after attention": (lambda m: _wrap(m, "blocks.0.hook_attn_out", DOUBLED), "stream", "direct_logit_attribution"),
    "head write scaled": (lambda m: _wrap(m, "blocks.1.attn.hook_z", DOUBLED), "heads", "path_patching"),
    "value scaled": (lambda m: _wrap(m, "blocks.1.attn.hook_v", DOUBLED), "values", "second_order_attribution"),
    "embedding scaled": (lambda m: _wrap(m, "hook_embed", DOUBLED), "embedding", "direct_logit_attribution"),
    "soft-cap after the unembedding": (_softcap_after_unembedding, "readout", "logit_lens"),
    "a step start_at_layer skips": (_start_skips_a_step, "start at layer", None),
    "input off path": (lambda m: _wrap(m, "blocks.0.hook_resid_pre", OFF_PATH), "input", "attribution_patching"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_each_broken_identity_is_named(mutation):
    make, identity, helper = MUTATIONS[mutation]
    model = _model()
    make(model)
    cert = ri.certify(model)
    assert identity in cert.failed(), cert.table()
    assert cert[identity].why, "a failing identity says what fails"
    if helper is None:
        return
    tokens, reference = torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 6))
    calls = {
        "edge_attribution_patching": lambda: ri.edge_attribution_patching(model, tokens, lambda lg: lg[:, -1, 0].mean(), reference=reference),
        "attribution_patching": lambda: ri.attribution_patching(model, tokens, lambda lg: lg[:, -1, 0].mean(), reference=reference),
        "direct_logit_attribution": lambda: ri.direct_logit_attribution(model, tokens, targets=tokens),
        "path_patching": lambda: ri.path_patching(model, tokens, lambda lg: lg[:, -1, 0].mean(), reference=reference),
        "second_order_attribution": lambda: ri.second_order_attribution(model, tokens, targets=tokens, positions=[-1]),
        "logit_lens": lambda: ri.logit_lens(model, tokens),
    }
    with pytest.raises(ValueError, match=f"the identity '{identity}' fails"):
        calls[helper]()


def test_the_scan_runs_from_the_tokens_where_start_at_layer_fails():
    """Where running from a layer misses a step, the scan (and exact path patching) run every pass from
    the tokens: the number is the hand-written ablation's, not the shortcut's."""
    model = _model()
    _start_skips_a_step(model)
    tokens = torch.randint(0, 50, (2, 6))
    metric = lambda lg: lg[:, -1, 0].mean()  # noqa: E731
    scan = ri.head_ablation_scan(model, tokens, metric)

    def zero(t, hook):
        t = t.clone()
        t[:, :, 1] = 0
        return t

    with torch.no_grad():
        want = float(metric(model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero)])))
    assert float(scan.ablated[1, 1]) == pytest.approx(want, abs=1e-10)


def test_the_certificate_follows_the_model():
    """Cached until the weights, the hooks or the dtype change: an in-place change of a weight is seen."""
    model = _model()
    first = ri.certify(model)
    assert ri.certify(model) is first
    with torch.no_grad():
        next(model.parameters()).mul_(1.0)  # an in-place change (the version counter moves)
    assert ri.certify(model) is not first
    model.add_hook("blocks.0.attn.hook_z", lambda t, hook: None)
    hooked = ri.certify(model)
    assert len(hooked.hooks) == 1 and hooked.hooks[0].startswith("blocks.0.attn.hook_z") and hooked.failed() == ()
    model.reset_hooks()


def test_a_dropped_bias_in_a_conversion_is_refused(tmp_path, monkeypatch):
    """A conversion that loses a parameter (as 3.9 loses a Llama checkpoint's biases) is refused at load,
    naming the conversion: the loaded model's log-probabilities are compared with the checkpoint's."""
    from hf_families import save_checkpoint

    save_checkpoint("gpt_neox", tmp_path)
    real = _backend.from_hf

    def lossy(*args, **kwargs):
        model = real(*args, **kwargs)
        with torch.no_grad():
            model.blocks[0].attn.b_O.zero_() if _backend.TL_MAJOR < 4 else _backend.bias_parameters(model, ["b_O"])[0].zero_()
        return model

    monkeypatch.setattr(_backend, "from_hf", lossy)
    with pytest.raises(ValueError, match="conversion of GPTNeoXForCausalLM does not compute the checkpoint's function"):
        ri.load_pretrained(tmp_path, dtype=torch.float64)
