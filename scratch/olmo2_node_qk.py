"""Node QK fix (nodes="q"/"k", qk_fix=True) on OLMo-2 (4.3, float64): each head's hook_q (hook_k) alone set to the
reference's, its z' read, sum (z'_h - z_h) . dm/dz_h; against attribution_patching's effect."""
import sys, torch, rs_interp as ri
fam = sys.argv[1] if len(sys.argv) > 1 else "olmo2"
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (3, 9), generator=g), torch.randint(0, 299, (3, 9), generator=g)
import os
if os.environ.get("ROWHOOK"):  # a TransformerLens hook left on that edits batch row 1 only (the certificate's rows fail)
    def edit(t, hook):
        t = t.clone(); t[1] = t[1] * 1.5 + 0.1; return t
    model.add_hook("blocks.0.hook_mlp_out" if os.environ["ROWHOOK"] == "mlp" else "blocks.0.attn.hook_z", edit)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
for which in ("q", "k"):
    got = ri.attribution_patching(model, toks, metric, reference=ref, nodes=which, qk_fix=True)
    for l in range(model.cfg.n_layers):
        name = f"blocks.{l}.attn.hook_{which}"
        box = {}
        with torch.no_grad():
            model.run_with_hooks(ref, fwd_hooks=[(name, lambda t, hook: box.__setitem__("ref", t.clone()))])
        zb = {}
        def keep(t, hook):
            t.retain_grad(); zb["z"] = t; return t
        metric(model.run_with_hooks(toks, fwd_hooks=[(f"blocks.{l}.attn.hook_z", keep)])).backward()
        gz, z = zb["z"].grad.detach(), zb["z"].detach()
        n = box["ref"].shape[2]
        out = []
        for h in range(n):
            def patch(t, hook, h=h):
                t = t.clone(); t[:, :, h] = box["ref"][:, :, h]; return t
            zz = {}
            with torch.no_grad():
                model.run_with_hooks(toks, fwd_hooks=[(name, patch), (f"blocks.{l}.attn.hook_z", lambda t, hook: zz.__setitem__("z", t.clone()))])
            heads = [h] if n == model.cfg.n_heads else [hh for hh in range(model.cfg.n_heads) if hh // (model.cfg.n_heads // n) == h]
            out.append(float(((zz["z"] - z)[:, :, heads] * gz[:, :, heads]).sum()))
        print(fam, which, "layer", l, "got", [round(float(v), 8) for v in got.effect[l]], "brute", [round(v, 8) for v in out])
