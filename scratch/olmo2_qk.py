"""OLMo-2 (4.3, float64): edge L0H1 -> L1H0.q under the query norm spanning the heads.
Brute forces: (a) move only head 0's query input (per-head, what the receiver 'L1H0.q' names),
(b) move the whole layer's query input (what the QK fix does)."""
import torch, rs_interp as ri
torch.manual_seed(0)
model = ri.load_pretrained("/tmp/red_ckpt/olmo2", dtype=getattr(torch, __import__("os").environ.get("DT", "float64")))
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (3, 9), generator=g), torch.randint(0, 299, (3, 9), generator=g)
import os
if os.environ.get("ROWHOOK"):  # a TransformerLens hook left on that edits batch row 1 only (the certificate's rows fail)
    def edit(t, hook):
        t = t.clone(); t[1] = t[1] * 1.5 + 0.1; return t
    model.add_hook("blocks.0.attn.hook_z", edit)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
def rec(t, names, hooks=()):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(t, fwd_hooks=[(n, lambda x, hook, n=n: box.__setitem__(n, x.detach().clone())) for n in names])
    return box
attn0 = model.blocks[0].attn
W_O = attn0.W_O.detach(); H, dh = W_O.shape[0], W_O.shape[1]
b_O = getattr(attn0, "b_O", None); b_O = 0 if b_O is None else b_O.detach()
z, zr = rec(toks, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"], rec(ref, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"]
r = torch.einsum("bphd,hdm->bpm", z, W_O) + b_O
dW = (zr - z)[:, :, 1] @ W_O[1]
post = model.blocks[0].ln1_post.original_component
P = lambda x: post.weight * x / (x.pow(2).mean(-1, keepdim=True) + post.variance_epsilon).sqrt()
_, w_lin = torch.func.jvp(P, (r,), (dW,))
w_pat = P(r + dW) - P(r)
x = rec(toks, ["blocks.1.hook_resid_pre"])["blocks.1.hook_resid_pre"]
q_proj = model.blocks[1].attn.original_component.q_proj
print(type(model.blocks[1].attn.original_component).__name__, [n for n,_ in model.blocks[1].attn.original_component.named_children()])
def z_with(moved_in, head_only):
    def hook(mod, args, out):
        new = mod(moved_in) if False else torch.nn.functional.linear(moved_in, mod.weight, mod.bias)
        if head_only is None:
            return new
        o = out.clone(); sl = slice(head_only * dh, (head_only + 1) * dh); o[..., sl] = new[..., sl]; return o
    h = q_proj.register_forward_hook(hook)
    try:
        return rec(toks, ["blocks.1.attn.hook_z"])["blocks.1.attn.hook_z"][:, :, 0]
    finally:
        h.remove()
# dm/dz for L1H0
zbox = {}
def keep(t, hook):
    t.retain_grad(); zbox["z"] = t; return t
logits = model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", keep)])
metric(logits).backward(); gz = zbox["z"].grad[:, :, 0].detach(); z1 = zbox["z"].detach()[:, :, 0]
fixed = ri.edge_attribution_patching(model, toks, metric, reference=ref, qk_fix=True)
print("receivers sample", [r_ for r_ in fixed.layout.receivers if r_.startswith("L1")][:6])
got_qk = fixed.edge("L0H1", "L1H0.q")
print("QK fix got", got_qk)
for name, hd in (("per-head(only head0 input)", 0), ("whole layer", None)):
    print(" QK brute", name, float(((z_with(x + w_lin, hd) - z1) * gz).sum()))
pp = ri.path_patching(model, toks, metric, reference=ref, edges=[("L0H1", "L1H0.q")])
with torch.no_grad(): clean = float(metric(model(toks)))
def metric_with(moved_in, hd):
    def hook(mod, args, out):
        new = torch.nn.functional.linear(moved_in, mod.weight, mod.bias)
        if hd is None: return new
        o = out.clone(); sl = slice(hd * dh, (hd + 1) * dh); o[..., sl] = new[..., sl]; return o
    h = q_proj.register_forward_hook(hook)
    try:
        with torch.no_grad(): return float(metric(model(toks)))
    finally: h.remove()
print("path patching got", pp.edge("L0H1", "L1H0.q"))
for name, hd in (("per-head", 0), ("whole layer", None)):
    print(" PP brute", name, metric_with(x + w_pat, hd) - clean)
eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
e = torch.zeros((), dtype=torch.float64, requires_grad=True)
def hook(mod, args, out):
    new = torch.nn.functional.linear(x + e * w_lin, mod.weight, mod.bias)
    o = out.clone(); o[..., :dh] = new[..., :dh]; return o
h = q_proj.register_forward_hook(hook)
(gr,) = torch.autograd.grad(metric(model(toks)), e); h.remove()
print("EAP got", eap.edge("L0H1", "L1H0.q"), "per-head autograd", float(gr))
