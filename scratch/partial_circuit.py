"""evaluate_circuit with a few edges cut (into MLP0, MLP1, L1 q/k/v and the logits), on a post-norm model
(4.3, float64), against one hand-hooked forward pass: receiver inputs moved by each cut edge's patched write
P(r + (z_ref - z)_h W_O^h) - P(r) (this pass's r, z), MLP/embed writes ref - this pass. argv: family"""
import sys, torch, rs_interp as ri
fam = sys.argv[1]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=getattr(torch, __import__("os").environ.get("DT", "float64")))
g = torch.Generator().manual_seed(3)
B = int(sys.argv[2]) if len(sys.argv) > 2 else 3
P_ = int(sys.argv[3]) if len(sys.argv) > 3 else 9
toks, ref = torch.randint(0, 299, (B, P_), generator=g), torch.randint(0, 299, (B, P_), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
H, dh = model.cfg.n_heads, model.cfg.d_head
layout = ri.edge_layout(model)
kv = [r for r in layout.receivers if r.startswith("L1") and r.endswith(".k")]
cut = [("L0H1", "MLP0"), ("L0H2", "L1H0.q"), ("embed", "L1H2.q"), ("L0H3", kv[0]), ("MLP0", kv[-1].replace(".k", ".v")),
       ("MLP0", "MLP1"), ("L1H2", "MLP1"), ("L0H3", "logits"), ("L1H0", "logits")]
keep = [e for e in layout.edges() if e not in cut]
assert len(keep) == len(layout.edges()) - len(cut), cut
import os
METHOD = os.environ.get("METHOD", "resample")
got = ri.evaluate_circuit(model, toks, metric, keep, reference=ref, method=METHOD)

def rec(t, names):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(t, fwd_hooks=[(n, lambda x, hook, n=n: box.__setitem__(n, x.detach().clone())) for n in names])
    return box
names = ["blocks.0.hook_resid_pre", "blocks.0.attn.hook_z", "blocks.1.attn.hook_z", "blocks.0.hook_mlp_out"]
R = rec(ref, names)
if METHOD == "position_mean":  # each record's mean over the reference batch at each position
    R = {k: v.mean(0, keepdim=True).expand_as(v) for k, v in R.items()}
elif METHOD == "mean":  # over the batch and positions
    R = {k: v.mean((0, 1), keepdim=True).expand_as(v) for k, v in R.items()}
elif METHOD == "zero":  # a head's output 0 (through its post-norm), an MLP's and the embedding's write 0
    R = {k: torch.zeros_like(v) for k, v in R.items()}
def Wb(l):
    a = model.blocks[l].attn; b = getattr(a, "b_O", None)
    return a.W_O.detach(), (0 if b is None else b.detach())
def Pn(l):
    mod = model.blocks[l].ln1_post.original_component
    w = mod.weight.detach(); gain = 1 + w if "Gemma" in type(mod).__name__ else w
    eps = getattr(mod, "eps", getattr(mod, "variance_epsilon", None))
    return lambda x: gain * x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
def change(l, h, z, zr):
    W_O, b_O = Wb(l); r = torch.einsum("bphd,hdm->bpm", z, W_O) + b_O
    return Pn(l)(r + (zr - z)[:, :, h] @ W_O[h]) - Pn(l)(r)
st = {}
def store(n):
    return (n, lambda x, hook: st.__setitem__(n, x.detach().clone()))
blk0, blk1 = model.blocks[0], model.blocks[1]
handles = []
def pre(mod, fn):
    handles.append(mod.register_forward_pre_hook(lambda m, a: (a[0] + fn(), *a[1:])))
mlp_read = lambda l: model.blocks[l].ln2 if fam != "olmo2" else model.blocks[l].mlp
pre(mlp_read(0), lambda: change(0, 1, st["blocks.0.attn.hook_z"], R["blocks.0.attn.hook_z"]))
pre(mlp_read(1), lambda: (R["blocks.0.hook_mlp_out"] - st["blocks.0.hook_mlp_out"])
    + change(1, 2, st["blocks.1.attn.hook_z"], R["blocks.1.attn.hook_z"]))
pre(model.ln_final, lambda: change(0, 3, st["blocks.0.attn.hook_z"], R["blocks.0.attn.hook_z"])
    + change(1, 0, st["blocks.1.attn.hook_z"], R["blocks.1.attn.hook_z"]))
attn1 = blk1.attn.original_component
ln1 = (lambda x: blk1.ln1.original_component(x)) if fam != "olmo2" else (lambda x: x)
def proj_hook(moves):  # moves: list of (slice, delta fn)
    def hook(mod, args, out):
        o = out.clone()
        x = st["blocks.1.hook_resid_pre"]
        for sl, fn in moves:
            new = torch.nn.functional.linear(ln1(x + fn()), mod.weight, mod.bias)
            o[..., sl] = new[..., sl]
        return o
    return hook
z0d = lambda h: change(0, h, st["blocks.0.attn.hook_z"], R["blocks.0.attn.hook_z"])
nkv = attn1.k_proj.weight.shape[0] // dh
handles.append(attn1.q_proj.register_forward_hook(proj_hook([(slice(0, dh), lambda: z0d(2)),
    (slice(2 * dh, 3 * dh), lambda: R["blocks.0.hook_resid_pre"] - st["blocks.0.hook_resid_pre"])])))
handles.append(attn1.k_proj.register_forward_hook(proj_hook([(slice(0, dh), lambda: z0d(3))])))
handles.append(attn1.v_proj.register_forward_hook(proj_hook([(slice((nkv - 1) * dh, nkv * dh),
    lambda: R["blocks.0.hook_mlp_out"] - st["blocks.0.hook_mlp_out"])])))
try:
    with torch.no_grad():
        lg = model.run_with_hooks(toks, fwd_hooks=[store(n) for n in names + ["blocks.1.hook_resid_pre"]])
    want = float(metric(lg))
finally:
    for h in handles: h.remove()
with torch.no_grad(): clean = float(metric(model(toks)))
print(fam, "cut", cut)
print(f"evaluate_circuit got {got!r} brute {want!r} (clean {clean!r}) diff {got - want:.3e}")
