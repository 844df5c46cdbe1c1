"""EAP-IG edges out of L0H1 on a post-norm model (4.3, float64), each against its own brute force:
mean over alpha in {0, 1/3, 2/3} of d/de m(run with blocks.0.hook_resid_pre = x_ref + alpha (x - x_ref) and the
receiver's input moved by P(r_a + e (z_ref - z)_1 W_O^1) - P(r_a)), r_a this pass's raw attention output, autograd
at e = 0. Receivers: logits, MLP1, L1H0.q (q_proj's head-0 slice recomputed), the first KV head's k. argv: family"""
import sys, torch, rs_interp as ri
fam = sys.argv[1]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (3, 9), generator=g), torch.randint(0, 299, (3, 9), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
dh = model.cfg.d_head
eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=3)
def rec(t, names):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(t, fwd_hooks=[(n, lambda x, hook, n=n: box.__setitem__(n, x.detach().clone())) for n in names])
    return box
C = rec(toks, ["blocks.0.hook_resid_pre", "blocks.0.attn.hook_z"]); R = rec(ref, ["blocks.0.hook_resid_pre", "blocks.0.attn.hook_z"])
x, xr = C["blocks.0.hook_resid_pre"], R["blocks.0.hook_resid_pre"]
d = (R["blocks.0.attn.hook_z"] - C["blocks.0.attn.hook_z"])[:, :, 1]
a0 = model.blocks[0].attn; W_O = a0.W_O.detach(); b_O = getattr(a0, "b_O", None); b_O = 0 if b_O is None else b_O.detach()
mod = model.blocks[0].ln1_post.original_component
gain = 1 + mod.weight.detach() if "Gemma" in type(mod).__name__ else mod.weight.detach()
eps = getattr(mod, "eps", getattr(mod, "variance_epsilon", None))
P = lambda v: gain * v / (v.pow(2).mean(-1, keepdim=True) + eps).sqrt()
blk1 = model.blocks[1]; attn1 = blk1.attn.original_component
ln1 = (lambda v: blk1.ln1.original_component(v)) if fam != "olmo2" else (lambda v: v)
mlp_read = blk1.ln2 if fam != "olmo2" else blk1.mlp
kv = [r for r in eap.layout.receivers if r.startswith("L1") and r.endswith(".k")][0]
def brute(receiver):
    total = 0.0
    for alpha in (0.0, 1 / 3, 2 / 3):
        st = {}
        e = torch.zeros((), dtype=torch.float64, requires_grad=True)
        def w():
            z = st["z"].detach(); r = torch.einsum("bphd,hdm->bpm", z, W_O) + b_O
            return P(r + e * (d @ W_O[1])) - P(r)
        handles = []
        if receiver == "logits":
            handles.append(model.ln_final.register_forward_pre_hook(lambda m, a: (a[0] + w(), *a[1:])))
        elif receiver == "MLP1":
            handles.append(mlp_read.register_forward_pre_hook(lambda m, a: (a[0] + w(), *a[1:])))
        else:
            proj = attn1.q_proj if receiver.endswith(".q") else attn1.k_proj
            def hook(m, a, out):
                new = torch.nn.functional.linear(ln1(st["x1"] + w()), m.weight, m.bias)
                o = out.clone(); o[..., :dh] = new[..., :dh]; return o
            handles.append(proj.register_forward_hook(hook))
        fwd = [("blocks.0.hook_resid_pre", lambda t, hook: xr + alpha * (t - xr)),
               ("blocks.0.attn.hook_z", lambda t, hook: st.__setitem__("z", t) or t),
               ("blocks.1.hook_resid_pre", lambda t, hook: st.__setitem__("x1", t) or t)]
        try:
            (gr,) = torch.autograd.grad(metric(model.run_with_hooks(toks, fwd_hooks=fwd)), e)
        finally:
            for h in handles: h.remove()
        total += float(gr) / 3
    return total
for rcv in ("logits", "MLP1", "L1H0.q", kv):
    print(fam, f"EAP-IG L0H1 -> {rcv}: got {eap.edge('L0H1', rcv)!r} brute {brute(rcv)!r}")
