"""Path patching L0H1 -> logits with a user hook left on (4.3, float64) against a brute force under the same hook.
argv: family hookkind (see hooks_left_on.py)."""
import sys, torch, rs_interp as ri
fam, kind = sys.argv[1], sys.argv[2]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (3, 9), generator=g), torch.randint(0, 299, (3, 9), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
def rec(t, names):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(t, fwd_hooks=[(n, lambda x, hook, n=n: box.__setitem__(n, x.detach().clone())) for n in names])
    return box
def brute():
    W_O = model.blocks[0].attn.W_O.detach()
    b_O = getattr(model.blocks[0].attn, "b_O", None); b_O = 0 if b_O is None else b_O.detach()
    z, zr = rec(toks, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"], rec(ref, ["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"]
    r = torch.einsum("bphd,hdm->bpm", z, W_O) + b_O
    dW = (zr - z)[:, :, 1] @ W_O[1]
    post = getattr(model.blocks[0], "ln1_post", None)
    if post is not None:
        p = post.original_component
        P = lambda x: ((1 + p.weight.double()) if "Gemma" in type(p).__name__ else p.weight) * x / (x.pow(2).mean(-1, keepdim=True) + getattr(p, "eps", getattr(p, "variance_epsilon", None))).sqrt()
        w = P(r + dW) - P(r)
    else:
        w = dW
    with torch.no_grad():
        clean = float(metric(model(toks)))
        h = model.ln_final.register_forward_pre_hook(lambda m, a: (a[0] + w, *a[1:]))
        try:
            moved = float(metric(model(toks)))
        finally:
            h.remove()
    return moved - clean
pp = lambda: ri.path_patching(model, toks, metric, reference=ref, edges=[("L0H1", "logits")], progress=False).edge("L0H1", "logits")
print("no hook: got", pp(), "brute", brute())
if kind == "tl_row":
    def edit(t, hook):
        t = t.clone(); t[1] = t[1] * 1.5 + 0.1; return t
    model.add_hook("blocks.0.attn.hook_z", edit)
else:
    mod = model.blocks[1].mlp.original_component if hasattr(model.blocks[1].mlp, "original_component") else model.blocks[1].mlp
    def edit(m, args, out):
        o = out.clone(); o[0] = o[0] * 1.5 + 0.1; return o
    mod.register_forward_hook(edit)
print("hook:", kind, "got", pp(), "brute", brute())
print("certificate after:", ri.certify(model).holds("rows"))
