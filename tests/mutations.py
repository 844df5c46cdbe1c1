"""One mutation per identity of the certificate, each breaking that identity the way a real model,
conversion or user hook does (a hook point taken off the forward path, a norm after a sublayer, a hook
that edits one prompt, a hook on the MLP's path, a config that disagrees with the weights ...), shared by
tests/exact/test_certificate.py and tests/integration/test_certificate_api.py.

The mutations are plain PyTorch and TransformerLens: a hook point replaced in its parent module by a
wrapper that calls it and then uses something else, hooks added with ``model.add_hook`` (they stay on the
model, as a user's hook left on does), module hooks; nothing of rs_interp's but ``d_vocab_out``."""

from __future__ import annotations

import torch

from rs_interp import _backend


class Wrapped(torch.nn.Module):
    """Calls the hook point (its hooks run), then passes on ``after(output, input)``."""

    def __init__(self, point, after):
        super().__init__()
        self.point, self.after = point, after

    def forward(self, x, *args, **kwargs):
        return self.after(self.point(x, *args, **kwargs), x)


def wrap(model, name, after):
    """Replace hook point ``name`` where its parent module calls it (found by identity)."""
    point = model.hook_dict[name]
    for module in model.modules():
        for attr, child in list(module._modules.items()):
            if child is point and not isinstance(module, Wrapped):
                module._modules[attr] = Wrapped(point, after)
                return
    raise AssertionError(f"no parent calls {name}")


OFF_PATH = lambda out, x: x  # noqa: E731  (the hook's output is dropped: the hook is off the forward path)
DOUBLED = lambda out, x: 2 * out  # noqa: E731  (something after the hook changes what flows on)


def mlp_in_off_path(model):
    _backend.set_flag(model, "use_hook_mlp_in", True)
    wrap(model, "blocks.1.hook_mlp_in", OFF_PATH)


def start_skips_a_step(model):
    """The full run changes layer 1's attention pattern in a way a run from layer 1 does not (as 4.3 drops
    BLOOM's alibi bias there): flagged by the embedding, which a run from a layer skips."""
    seen = {}
    model.embed.register_forward_hook(lambda mod, args, out: seen.update(full=True))
    wrap(model, "blocks.1.attn.hook_pattern", lambda out, x: out.tril() * 0.5 if seen.pop("full", False) else out)


def softcap_after_unembedding(model):
    model.unembed.register_forward_hook(lambda mod, args, out: 3.0 * torch.tanh(out / 3.0))


def reweighted_pattern(model):
    """A hook that moves the attention weights (as a bias on the scores would): the pattern is no longer
    the softmax of the bilinear scores, while the heads still apply the pattern they are given."""
    def fn(t, hook):
        t = t * torch.linspace(1.0, 2.0, t.shape[-1], dtype=t.dtype)
        return t / t.sum(-1, keepdim=True)
    model.add_hook("blocks.1.attn.hook_pattern", fn)


def edits_one_prompt(model):
    """A hook that edits one prompt of the batch by its row index (as a user's patch of one example)."""
    def fn(t, hook):
        t = t.clone()
        t[0, -1] += torch.linspace(-1.0, 1.0, t.shape[-1], dtype=t.dtype)  # a direction no norm removes
        return t
    model.add_hook("blocks.0.hook_resid_post", fn)


def narrower_vocabulary(model):
    from rs_interp.exact.readout import d_vocab_out

    model.cfg.d_vocab_out = d_vocab_out(model) - 1


def stop_returns_another_stream(model):
    """A forward that returns another tensor when asked to stop at a layer (as 4.3's native bridges return
    the logits for stop_at_layer=n_layers)."""
    real = model.forward

    def forward(*args, **kwargs):
        out = real(*args, **kwargs)
        return 2 * out if kwargs.get("stop_at_layer") is not None else out

    model.forward = forward


def norm_across_heads(model):
    """A hook that normalises every head's query together (one RMS over the heads and their dimensions, as OLMo-2's
    q_norm over n_heads * d_head does): one head's input then moves every head's query."""
    model.add_hook("blocks.1.attn.hook_q", lambda t, hook: t / t.pow(2).mean((-2, -1), keepdim=True).add(1e-6).sqrt())


def scaled(name, factor):
    return lambda model: model.add_hook(name, lambda t, hook: t * factor)


#: identity -> a mutation (applied in place to a 2-layer model; the MLP ones need MLPs).
MUTATIONS = {
    "embedding": lambda m: wrap(m, "hook_embed", DOUBLED),
    "stream": lambda m: wrap(m, "blocks.0.hook_attn_out", DOUBLED),
    "z": lambda m: wrap(m, "blocks.0.attn.hook_z", OFF_PATH),
    "heads": lambda m: wrap(m, "blocks.1.attn.hook_z", DOUBLED),
    "values": lambda m: wrap(m, "blocks.1.attn.hook_v", DOUBLED),
    "scores": reweighted_pattern,
    "scores read": reweighted_pattern,
    "projections": scaled("blocks.1.attn.hook_q", 2.0),
    "input": lambda m: wrap(m, "blocks.0.hook_resid_pre", OFF_PATH),
    "readers": mlp_in_off_path,
    "head inputs": norm_across_heads,
    "mlp reads": scaled("blocks.1.ln2.hook_normalized", 2.0),
    "mlp writes": scaled("blocks.1.hook_mlp_out", 2.0),
    "mlp weights": scaled("blocks.1.mlp.hook_post", 0.5),
    "readout": softcap_after_unembedding,
    "vocabulary": narrower_vocabulary,
    "gradients": lambda m: m.add_hook("blocks.1.hook_resid_mid", lambda g, hook: (2 * g,), dir="bwd"),
    "rows": edits_one_prompt,
    "start at layer": start_skips_a_step,
    "stop at layer": stop_returns_another_stream,
}
