"""Brute forces of the gradient estimates, written apart from the library: central finite differences
of a metric along a patch, with plain hooks on the raw forward (a head's q/k/v recomputed from a moved
input through a LayerNorm written out by hand). The node and edge attribution tests and the trust tests
read them.
"""

import pytest
import torch

from tests.builders import ln1_by_hand, make_variant, needs_tl3

EPS = 1e-4  # central differences: error O(EPS^2) ~ 1e-8 on these metrics


def make_case(variant, seed=1):
    model = make_variant(*variant, seed=seed, n_layers=3, n_heads=2)
    g = torch.Generator().manual_seed(seed)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (2, 8), generator=g) for _ in range(2))
    with torch.no_grad():
        _, clean = model.run_with_cache(toks)
        _, refc = model.run_with_cache(ref)
    return model, toks, ref, clean, refc


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 3].mean() + 0.1 * logits[:, 2, 5].sum()


def derivative(model, toks, hook_name, add):
    """Central difference of the metric with ``add(t, eps)`` applied at ``hook_name``; written apart from the library."""
    def at(eps):
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=[(hook_name, lambda t, hook: add(t, eps))])))
    return (at(EPS) - at(-EPS)) / (2 * EPS)


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", False),
            pytest.param((None, "shortformer", True), marks=needs_tl3)]


def head_input_derivative(model, toks, kind, layer, head, w):
    """d metric / d eps with head ``head``'s ``kind`` (q, k or v) computed from ``resid_pre + eps w``:
    the projection recomputed at ``hook_{kind}`` (before rotary), which both TransformerLens versions have."""
    attn = model.blocks[layer].attn
    W, b = getattr(attn, f"W_{kind.upper()}")[head], getattr(attn, f"b_{kind.upper()}")[head]
    shortformer = model.cfg.positional_embedding_type == "shortformer"

    def at(eps):
        box = {}

        def keep(t, hook):
            box["x"] = t

        def project(t, hook):
            t = t.clone()
            x = box["x"] + eps * w
            if shortformer and kind in "qk":  # shortformer: queries and keys read the positions too
                x = x + box["pos"]
            t[:, :, head] = ln1_by_hand(model, layer, x) @ W + b
            return t

        hooks = [(f"blocks.{layer}.hook_resid_pre", keep), (f"blocks.{layer}.attn.hook_{kind}", project)]
        hooks += [("hook_pos_embed", lambda t, hook: box.update(pos=t))] if shortformer else []
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=hooks)))
    return (at(EPS) - at(-EPS)) / (2 * EPS)


def resid0(model, toks):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: box.update(x=t.clone()))])
    return box["x"]


def write(model, clean, refc, sender, toks=None, ref=None):
    """The change of a sender's write, reference minus run (written apart from the library)."""
    if sender == "embed":
        return resid0(model, ref) - resid0(model, toks)
    if sender.startswith("MLP"):
        name = f"blocks.{int(sender[3:])}.hook_mlp_out"
        return refc[name] - clean[name]
    l, h = (int(x) for x in sender[1:].split("H"))
    name = f"blocks.{l}.attn.hook_z"
    return (refc[name] - clean[name])[:, :, h] @ model.blocks[l].attn.W_O[h]


def edge_derivative(model, toks, receiver, w):
    """d metric / d eps with ``eps w`` added to one receiver's input only."""
    if receiver == "logits":
        return derivative(model, toks, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", lambda t, eps: t + eps * w)
    if receiver.startswith("MLP"):
        model.cfg.use_hook_mlp_in = True
        try:
            return derivative(model, toks, f"blocks.{int(receiver[3:])}.hook_mlp_in", lambda t, eps: t + eps * w)
        finally:
            model.cfg.use_hook_mlp_in = False
    head, kind = receiver.split(".")
    l, h = (int(x) for x in head[1:].split("H"))
    return head_input_derivative(model, toks, kind, l, h, w)


def upstream(sender, receiver):
    """The layout's rule, written out: embed feeds everything; a head or MLP of layer l feeds later
    layers, the logits, and (a head) its own layer's MLP."""
    if sender == "embed" or receiver == "logits":
        return True
    ls = int(sender[1:].split("H")[0]) if sender.startswith("L") else int(sender[3:])
    lr = int(receiver[1:].split("H")[0]) if receiver.startswith("L") else int(receiver[3:])
    return ls < lr or (ls == lr and sender.startswith("L") and receiver.startswith("MLP"))


def interpolated(model, toks, ref, alpha):
    """A hook putting the stream entering block 0 at x_ref + alpha (x - x_ref) (written apart)."""
    x_ref = resid0(model, ref)
    return ("blocks.0.hook_resid_pre", lambda t, hook: x_ref + alpha * (t - x_ref))
