"""Relevance patching by the reference implementation (FarnoushRJ/RelP: a TransformerLens fork whose modules apply LRP's
rules when ``cfg.use_lrp`` is set), run in that fork's own venv by tests/integration/test_references_relp_peap.py.

    python scripts/reference_relp.py IN.pt OUT.pt

IN.pt holds a HookedTransformer config (dict), its state dict, ``tokens``, ``reference``, ``answers`` (batch, 2) and
``eps`` (the fork's stabiliser: its own 1e-6, or a smaller one). The model is built with ``use_lrp=True`` in its
config (the fork picks the MLP's activation rule when the MLP is built) and the fork's three default rules plus its
AH-rule; the metric is the logit difference of the answers at the last position (mean over rows). OUT.pt holds the
fork's gradients, from its own backward pass, contracted with the senders' write changes exactly as its demo does
(``grad * (reference - run)``): per edge (sender, receiver) and per head's ``z`` node. With ``late`` set in IN.pt,
``use_lrp`` is set after the model is built, as the fork's README does (the MLP's activation rule is then not applied).
"""

from __future__ import annotations

import sys

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.utilities import activation_functions


def main(src: str, dst: str) -> None:
    data = torch.load(src)
    eps = float(data["eps"])
    activation_functions.stabilize = lambda z: z + ((z == 0.0).to(z) + z.sign()) * eps  # the fork's, with its epsilon
    late = bool(data.get("late", False))  # the fork's README: use_lrp set on a model already built
    cfg = HookedTransformerConfig(**data["cfg"], use_lrp=not late)
    cfg.LRP_rules = ["LN-rule", "Identity-rule", "Half-rule", "AH-rule"]
    model = HookedTransformer(cfg)
    model.cfg.use_lrp = True
    model.load_state_dict(data["state"], strict=False)
    model.eval()
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    tokens, reference, answers = data["tokens"], data["reference"], data["answers"]

    def metric(logits):
        last = logits[:, -1]
        return (last.gather(1, answers[:, :1]) - last.gather(1, answers[:, 1:])).mean()

    L = cfg.n_layers
    reads = [f"blocks.{l}.hook_{x}_input" for l in range(L) for x in "qkv"] + [f"blocks.{l}.hook_mlp_in" for l in range(L)]
    reads += [f"blocks.{L - 1}.hook_resid_post"] + [f"blocks.{l}.attn.hook_z" for l in range(L)]
    grads, acts = {}, {}
    seen = ("hook_resid_pre", "hook_z", "hook_mlp_out")
    model.add_hook(lambda n: n in reads, lambda t, hook: grads.__setitem__(hook.name, t.detach()), "bwd")
    model.add_hook(lambda n: n.endswith(seen), lambda t, hook: acts.__setitem__(hook.name, t.detach()), "fwd")
    metric(model(tokens)).backward()
    model.reset_hooks()
    ref = {}
    with torch.no_grad():
        model.run_with_hooks(reference, fwd_hooks=[(lambda n: n.endswith(seen), lambda t, hook: ref.__setitem__(hook.name, t.detach()))])
    writes = {"embed": ref["blocks.0.hook_resid_pre"] - acts["blocks.0.hook_resid_pre"]}
    for l in range(L):
        dz = ref[f"blocks.{l}.attn.hook_z"] - acts[f"blocks.{l}.attn.hook_z"]
        for h in range(cfg.n_heads):
            writes[f"L{l}H{h}"] = dz[:, :, h] @ model.blocks[l].attn.W_O[h].detach()
        if not cfg.attn_only:
            writes[f"MLP{l}"] = ref[f"blocks.{l}.hook_mlp_out"] - acts[f"blocks.{l}.hook_mlp_out"]
    edges = {}
    for s, w in writes.items():
        ls = -1 if s == "embed" else int(s[1:].split("H")[0]) if s.startswith("L") else int(s[3:])
        for l in range(L):
            for x in "qkv":
                if ls < l:  # no gradient reaches a query or key input under the AH-rule (its hook never fires): 0
                    g = grads.get(f"blocks.{l}.hook_{x}_input")
                    for h in range(cfg.n_heads):
                        edges[(s, f"L{l}H{h}.{x}")] = 0.0 if g is None else float((w * g[:, :, h]).sum())
            if not cfg.attn_only and (ls < l or (ls == l and s.startswith("L"))):
                edges[(s, f"MLP{l}")] = float((w * grads[f"blocks.{l}.hook_mlp_in"]).sum())
        edges[(s, "logits")] = float((w * grads[f"blocks.{L - 1}.hook_resid_post"]).sum())
    nodes = {(l, h): float(((ref[f"blocks.{l}.attn.hook_z"] - acts[f"blocks.{l}.attn.hook_z"])[:, :, h]
                            * grads[f"blocks.{l}.attn.hook_z"][:, :, h]).sum()) for l in range(L) for h in range(cfg.n_heads)}
    torch.save({"edges": edges, "nodes": nodes}, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
