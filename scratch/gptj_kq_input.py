"""GPT-J (4.3, float64): run_with_key_input / run_with_query_input against k_proj/q_proj forward hooks
(the head's slice recomputed from ln_1(x_0 + kept writes)). argv: family (gptj default)"""
import sys, torch, rs_interp as ri
fam = sys.argv[1] if len(sys.argv) > 1 else "gptj"
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
toks = torch.randint(0, 299, (2, 7), generator=torch.Generator().manual_seed(4))
dh = model.cfg.d_head
box = {}
with torch.no_grad():
    clean = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: box.__setitem__("x0", t.clone())),
                                                  ("blocks.0.attn.hook_z", lambda t, hook: box.__setitem__("z", t.clone()))])
blk = model.blocks[1]
hf_attn = blk.attn.original_component
hf_ln = blk.ln1.original_component
print(type(hf_attn).__name__, type(hf_ln).__name__)
W_O = model.blocks[0].attn.W_O.detach()
for which, proj in (("k", hf_attn.k_proj), ("q", hf_attn.q_proj)):
    for keep, heads in (([(0, 1)], [(1, 2)]), ([(0, 0), (0, 3)], None), ([], [(1, 0), (1, 3)])):
        fn = ri.run_with_key_input if which == "k" else ri.run_with_query_input
        got = fn(model, toks, layer=1, keep=keep, heads=heads)
        x = box["x0"] + sum((box["z"][:, :, h] @ W_O[h] for _, h in keep), torch.zeros_like(box["x0"]))
        hs = [h for _, h in heads] if heads is not None else range(model.cfg.n_heads)
        def hook(mod, args, out):
            o = out.clone(); new = torch.nn.functional.linear(hf_ln(x), mod.weight, mod.bias)
            for h in hs:
                o[..., h * dh:(h + 1) * dh] = new[..., h * dh:(h + 1) * dh]
            return o
        handle = proj.register_forward_hook(hook)
        try:
            with torch.no_grad(): want = model(toks)
        finally: handle.remove()
        print(which, keep, heads, "max |got - brute|", float((got - want).abs().max()), " |brute - clean|", float((want - clean).abs().max()))
