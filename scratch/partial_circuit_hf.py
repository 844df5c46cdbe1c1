"""evaluate_circuit and path patching with a few edges cut (into MLPs, per-head q/k/v and logits) on 4.3 bridges
without post-norms (GPT-J, Phi: parallel blocks, one shared input norm; OPT, GPT-Neo), float64, against one
hand-hooked forward pass on the Hugging Face modules: a per-head input recomputed as proj(ln(x + d))'s slice of
that head, a parallel MLP's input replaced by ln(x + d), a serial MLP's norm and the final norm given x + d.
argv: family [batch pos]"""
import sys, torch, rs_interp as ri
fam = sys.argv[1]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
B = int(sys.argv[2]) if len(sys.argv) > 2 else 3
P_ = int(sys.argv[3]) if len(sys.argv) > 3 else 9
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (B, P_), generator=g), torch.randint(0, 299, (B, P_), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
H, dh, L = model.cfg.n_heads, model.cfg.d_head, model.cfg.n_layers
parallel = getattr(model.blocks[0], "ln2", None) is None
layout = ri.edge_layout(model)
want_cuts = [("L0H1", "MLP0"), ("embed", "MLP0"), ("L0H2", "L1H0.q"), ("embed", "L1H2.q"), ("L0H3", "L1H1.k"), ("MLP0", "L1H3.v"), ("L0H3", "L1KV0.k"), ("MLP0", "L1KV1.v"), ("L0H1", "L1KV0.v"),
             ("MLP0", "MLP1"), ("L1H2", "MLP1"), ("L0H0", "MLP1"), ("L0H3", "logits"), ("L1H0", "logits"), ("embed", "L0H1.v")]
cut = [e for e in want_cuts if e in set(layout.edges())]
keep = [e for e in layout.edges() if e not in cut]
got = ri.evaluate_circuit(model, toks, metric, keep, reference=ref)

names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.attn.hook_z" for l in range(L)] + [f"blocks.{l}.hook_mlp_out" for l in range(L)]
def rec(t, ns):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(t, fwd_hooks=[(n, lambda x, hook, n=n: box.__setitem__(n, x.detach().clone())) for n in ns])
    return box
R = rec(ref, names)
st = {}
def write_change(sender):
    if sender == "embed":
        return R["blocks.0.hook_resid_pre"] - st["blocks.0.hook_resid_pre"]
    if sender.startswith("MLP"):
        n = f"blocks.{sender[3:]}.hook_mlp_out"; return R[n] - st[n]
    l, h = int(sender[1]), int(sender[3:])
    n = f"blocks.{l}.attn.hook_z"
    return (R[n] - st[n])[:, :, h] @ model.blocks[l].attn.W_O.detach()[h]
def delta(receiver, edges):
    return sum((write_change(s) for s, r in edges if r == receiver), torch.zeros(()))
def run(edges):
    handles = []
    for l in range(L):
        blk = model.blocks[l]
        ln = blk.ln1.original_component
        x = lambda l=l: st[f"blocks.{l}.hook_resid_pre"]
        if parallel:
            handles.append(blk.mlp.register_forward_pre_hook(
                lambda m, a, l=l, ln=ln, x=x: (ln(x() + delta(f"MLP{l}", edges)), *a[1:])))
        else:
            handles.append(blk.ln2.register_forward_pre_hook(
                lambda m, a, l=l: (a[0] + torch.as_tensor(delta(f"MLP{l}", edges)).reshape(a[0].shape if torch.as_tensor(delta(f"MLP{l}", edges)).dim() else ()), *a[1:])))  # OPT flattens (batch pos) there
        attn = blk.attn.original_component
        recv = [r for r in layout.receivers if r.startswith(f"L{l}") and "." in r]
        def slot(r):
            head = r.split(".")[0][len(f"L{l}"):]
            return int(head[2:]) if head.startswith("KV") else int(head[1:])
        if hasattr(attn, "query_key_value"):  # the bridge splits the fused projection into q, k, v Linears of its own
            mods = [(getattr(blk.attn, w).original_component, [r for r in recv if r.endswith("." + w)],
                     lambda w, sl: slice(sl * dh, (sl + 1) * dh)) for w in "qkv"]
        else:
            mods = [(getattr(attn, f"{w}_proj"), [r for r in recv if r.endswith("." + w)], lambda w, sl: slice(sl * dh, (sl + 1) * dh))
                    for w in "qkv"]
        for mod, rs, where in mods:
            def hook(m, a, out, rs=rs, where=where, ln=ln, x=x):
                o = out.clone()
                for r in rs:
                    d = delta(r, edges)
                    if isinstance(d, torch.Tensor) and d.dim() > 0:
                        sl = where(r[-1], slot(r))
                        o[..., sl] = torch.nn.functional.linear(ln(x() + d), m.weight, m.bias)[..., sl]
                return o
            handles.append(mod.register_forward_hook(hook))
    handles.append(model.ln_final.register_forward_pre_hook(lambda m, a: (a[0] + delta("logits", edges), *a[1:])))
    try:
        with torch.no_grad():
            lg = model.run_with_hooks(toks, fwd_hooks=[(n, lambda t, hook, n=n: st.__setitem__(n, t.detach().clone()))
                                                       for n in names + [f"blocks.{l}.hook_resid_pre" for l in range(L)]])
        return float(metric(lg))
    finally:
        for h in handles: h.remove()
clean = run([])
print(fam, "parallel" if parallel else "serial", "cut", cut)
print(f"  evaluate_circuit got {got!r} brute {run(cut)!r} (clean {clean!r})")
for e in cut:
    pp = ri.path_patching(model, toks, metric, reference=ref, edges=[e], progress=False).edge(*e)
    print(f"  path patching {e}: got {pp!r} brute {run([e]) - clean!r}")
