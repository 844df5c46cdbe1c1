"""Post-norm models (4.3, float64), odd shapes: per_example edges summed over rows = the effect (plain, EAP-IG and the
QK fix), DLA at batch 1 x length 1 summing to the centred logit, EAP edges at length 1 against autograd. argv: family"""
import sys, torch, rs_interp as ri
fam = sys.argv[1]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (3, 5), generator=g), torch.randint(0, 299, (3, 5), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
for kw in ({}, {"ig_steps": 3}, {"qk_fix": True}):
    e = ri.edge_attribution_patching(model, toks, metric, reference=ref, per_example=True, **kw)
    one = ri.edge_attribution_patching(model, toks, metric, reference=ref, **kw)
    print(fam, kw, "per_example sum - effect", float((e.per_example.sum(0) - one.effect).nan_to_num(0).abs().max()),
          "per_example sum - its effect", float((e.per_example.sum(0) - e.effect).nan_to_num(0).abs().max()))
t1 = torch.tensor([[17]])
if ri.certify(model).holds("heads"):
    try:
        dla = ri.direct_logit_attribution(model, t1, targets=torch.tensor([[5]]))
        with torch.no_grad(): lg = model(t1).to(torch.float64)
        want = (lg - lg.mean(-1, keepdim=True))[0, 0, 5]
        print(fam, "DLA P=1 sum - centred logit", float(dla.contributions.sum(0)[0, 0] - want))
    except ValueError as err:
        print(fam, "DLA refused:", str(err)[:120])
r1 = torch.tensor([[40]])
m1 = lambda lg: lg[:, -1, 3].mean()
eap = ri.edge_attribution_patching(model, t1, m1, reference=r1)
node = ri.attribution_patching(model, t1, m1, reference=r1)
tot = dict(zip(eap.layout.senders, eap.sender_totals().tolist()))
print(fam, "P=1 edges sum - node", max(abs(tot[f"L{l}H{h}"] - float(node.effect[l, h])) for l in range(2) for h in range(4)))
pp = ri.path_patching(model, t1, m1, reference=r1, edges=[("L0H1", "L1H0.q"), ("L0H1", "L1H0.k")], progress=False)
print(fam, "P=1 path patching into q, k:", pp.edge("L0H1", "L1H0.q"), pp.edge("L0H1", "L1H0.k") if "L1H0.k" in eap.layout.receivers else None)
