"""A PyTorch forward hook on layer 1's q_proj (Hugging Face module) that adds 0.3 to batch row 0's queries, added after a
first helper call (the certificate cached), on a 4.3 bridge (float64). The QK-fixed, plain EAP and path-patched edge
L0H1 -> L1H0.q against brute forces under the same hook (head 0's q recomputed from ln(x + w), then the user's hook).
argv: family"""
import sys, torch, rs_interp as ri
fam = sys.argv[1]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (3, 7), generator=g), torch.randint(0, 299, (3, 7), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
dh = model.cfg.d_head
first = ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True)
print("before the hook: QK fix", first.edge("L0H1", "L1H0.q"))
blk = model.blocks[1]
hf_attn = blk.attn.original_component
q_proj = hf_attn.q_proj if hasattr(hf_attn, "q_proj") else blk.attn.q.original_component  # BLOOM, Falcon: the bridge's split q
ln = (lambda v: v) if fam == "olmo2" else blk.ln1.original_component
def user(m, a, out):
    out = out.clone(); out[0] = out[0] + float(__import__("os").environ.get("ADD", "0.3")); return out
def rec(t, names):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(t, fwd_hooks=[(n, lambda x, hook, n=n: box.__setitem__(n, x.detach().clone())) for n in names])
    return box
def with_head0_moved(w, fn):
    """Run fn with head 0's query recomputed from ln(x + w), the user's hook after it."""
    def mine(m, a, out):
        o = out.clone(); o[..., :dh] = torch.nn.functional.linear(ln(st["x"] + w), m.weight, m.bias)[..., :dh]; return o
    h1 = q_proj.register_forward_hook(mine); h2 = q_proj.register_forward_hook(user)
    try:
        return fn()
    finally:
        h1.remove(); h2.remove()
st = {}
keep_x = ("blocks.1.hook_resid_pre", lambda t, hook: st.__setitem__("x", t) or t)
handle = q_proj.register_forward_hook(user)
try:
    fixed = ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True).edge("L0H1", "L1H0.q")
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref).edge("L0H1", "L1H0.q")
    pp = ri.path_patching(model, toks, metric, reference=ref, edges=[("L0H1", "L1H0.q")], progress=False).edge("L0H1", "L1H0.q")
    C, R = rec(toks, ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]), rec(ref, ["blocks.0.attn.hook_z"])
    W_O0 = model.blocks[0].attn.W_O.detach()
    dW = (R["blocks.0.attn.hook_z"] - C["blocks.0.attn.hook_z"])[:, :, 1] @ W_O0[1]
    w_lin = w_pat = dW
    post = getattr(model.blocks[0], "ln1_post", None)
    if post is not None:  # post-norm: the Jacobian write (EAP, QK fix) and the patched write (path patching)
        pm = post.original_component
        gain = 1 + pm.weight.detach() if "Gemma" in type(pm).__name__ else pm.weight.detach()
        eps = getattr(pm, "eps", getattr(pm, "variance_epsilon", None))
        Pn = lambda v: gain * v / (v.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        b_O = getattr(model.blocks[0].attn, "b_O", None)
        r0 = torch.einsum("bphd,hdm->bpm", C["blocks.0.attn.hook_z"], W_O0) + (0 if b_O is None else b_O.detach())
        w_lin = torch.func.jvp(Pn, (r0,), (dW,))[1]
        w_pat = Pn(r0 + dW) - Pn(r0)
    z = C["blocks.1.attn.hook_z"][:, :, 0]
    zb = {}
    def keep(t, hook):
        t.retain_grad(); zb["z"] = t; return t
    metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", keep)])).backward()
    gz = zb["z"].grad[:, :, 0].detach()
finally:
    handle.remove()
def z_moved():
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[keep_x, ("blocks.1.attn.hook_z", lambda t, hook: box.__setitem__("z", t.clone()))])
    return box["z"][:, :, 0]
def moved_metric():
    with torch.no_grad():
        return float(metric(model.run_with_hooks(toks, fwd_hooks=[keep_x])))
clean = with_head0_moved(torch.zeros(()), moved_metric)
print(fam, "QK fix got", fixed, "brute", float(((with_head0_moved(w_lin, z_moved) - z) * gz).sum()))
print(fam, "path patching got", pp, "brute", with_head0_moved(w_pat, moved_metric) - clean)
e = torch.zeros((), dtype=torch.float64, requires_grad=True)
def grad_run():
    return torch.autograd.grad(metric(model.run_with_hooks(toks, fwd_hooks=[keep_x])), e)[0]
print(fam, "EAP got", eap, "brute", float(with_head0_moved(e * w_lin, grad_run)))
with torch.no_grad():
    h = q_proj.register_forward_hook(user); hooked = float(metric(model(toks))); h.remove()
print(fam, "check: brute's clean", clean, "= the hooked model's", hooked)
