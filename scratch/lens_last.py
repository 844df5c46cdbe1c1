"""logit_lens: every reading point's log-distribution against softmax(softcap(ln_final(x) W_U + b_U)) written out from
the model's own modules on the recorded stream (plain hooks); the last point against the model's log_softmax.
argv: family dtype"""
import sys, torch, rs_interp as ri
fam, dt = sys.argv[1], getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float64")
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=dt)
toks = torch.randint(0, 299, (2, 6), generator=torch.Generator().manual_seed(4))
lens = ri.logit_lens(model, toks, full=True, sublayers=True)
with torch.no_grad(): out = model(toks).to(torch.float64).log_softmax(-1)
print(fam, dt, [a for a in dir(lens) if not a.startswith("_")][:30])
lp = lens.log_probs if hasattr(lens, "log_probs") else None
print("points", getattr(lens, "points", None))
if lp is not None:
    print("last point vs model:", float((lp[-1].to(torch.float64) - out).abs().max()))
print(lens.labels)
names = {}
L = model.cfg.n_layers
pts = [f"blocks.{l}.hook_{w}" for l in range(L) for w in ("resid_pre", "resid_mid")] + [f"blocks.{L-1}.hook_resid_post"]
box = {}
with torch.no_grad():
    model.run_with_hooks(toks, fwd_hooks=[(n, lambda t, hook, n=n: box.__setitem__(n, t.clone())) for n in pts])
hf_final = model.ln_final.original_component if hasattr(model.ln_final, "original_component") else model.ln_final
cap = getattr(model.cfg, "output_logits_soft_cap", None)
W_U = model.W_U.detach(); b_U = model.b_U.detach() if getattr(model, "b_U", None) is not None else 0
for i, n in enumerate(pts):
    with torch.no_grad():
        lg = hf_final(box[n]) @ W_U + b_U
        if cap and cap > 0: lg = cap * torch.tanh(lg / cap)
    want = lg.to(torch.float64).log_softmax(-1)
    print(n, lens.labels[i] if i < len(lens.labels) else None, float((lens.log_probs[i].to(torch.float64) - want).abs().max()))
