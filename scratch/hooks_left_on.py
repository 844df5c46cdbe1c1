"""User hooks left on during a helper call (4.3, float64). argv: family hookkind
hookkind: tl_row (a TransformerLens hook on blocks.0.attn.hook_z editing batch row 1 only, model.add_hook),
          torch_row (a PyTorch forward hook on blocks[1].mlp's Hugging Face module scaling row 0, added after a
          first helper call). Checks: certificate, path patching L0H1->logits and evaluate_circuit(full)/(empty)
          against brute forces run with the same hook on."""
import sys, torch, rs_interp as ri
fam, kind = sys.argv[1], sys.argv[2]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (3, 9), generator=g), torch.randint(0, 299, (3, 9), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
layout = ri.edge_layout(model)
print("no hook eap", float(ri.edge_attribution_patching(model, toks, metric, reference=ref).sender_totals()[list(layout.senders).index("L0H1")]), float(ri.attribution_patching(model, toks, metric, reference=ref).effect[0, 1]))
first = ri.path_patching(model, toks, metric, reference=ref, edges=[("L0H1", "logits")], progress=False)
print("before hook: pp", first.edge("L0H1", "logits"))
if kind == "tl_row":
    def edit(t, hook):
        t = t.clone(); t[1] = t[1] * 1.5 + 0.1; return t
    model.add_hook("blocks.0.attn.hook_z", edit)
else:
    mod = model.blocks[1].mlp.original_component if hasattr(model.blocks[1].mlp, "original_component") else model.blocks[1].mlp
    def edit(m, args, out):
        o = out.clone(); o[0] = o[0] * 1.5 + 0.1; return o
    mod.register_forward_hook(edit)
with torch.no_grad():
    clean, reft = float(metric(model(toks))), float(metric(model(ref)))
print("clean/ref under hook", clean, reft)
for name, fn in [("path_patching", lambda: ri.path_patching(model, toks, metric, reference=ref, edges=[("L0H1", "logits")], progress=False).edge("L0H1", "logits")),
                 ("evaluate full", lambda: ri.evaluate_circuit(model, toks, metric, layout.edges(), reference=ref)),
                 ("evaluate empty", lambda: ri.evaluate_circuit(model, toks, metric, [], reference=ref)),
                 ("eap sum vs node", lambda: (float(ri.edge_attribution_patching(model, toks, metric, reference=ref).sender_totals()[list(layout.senders).index("L0H1")]), float(ri.attribution_patching(model, toks, metric, reference=ref).effect[0, 1]))),
                 ("eap-ig sum vs node", lambda: (float(ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=3).sender_totals()[list(layout.senders).index("L0H1")]), float(ri.attribution_patching(model, toks, metric, reference=ref, ig_steps=3).effect[0, 1]))),
                 ]:
    try:
        print(name, "got", fn())
    except ValueError as e:
        print(name, "REFUSED:", str(e)[:300])
print("want: evaluate full =", clean, " empty =", reft)
