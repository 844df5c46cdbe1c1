"""ACDC and the faithfulness curve on post-norm models (4.3, float64): ACDC's final equals evaluate_circuit of its
kept edges (whose partial-circuit numbers scratch/partial_circuit.py checks by brute force); the curve's values equal
evaluate_circuit of the circuits selection picks (circuit_at + prune). argv: family"""
import sys, torch, rs_interp as ri
from rs_interp.circuits.selection import circuit_at
fam = sys.argv[1]
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=torch.float64)
g = torch.Generator().manual_seed(3)
toks, ref = torch.randint(0, 299, (2, 6), generator=g), torch.randint(0, 299, (2, 6), generator=g)
metric = lambda lg: (lg[:, -1, 1] - lg[:, -1, 2]).mean()
run = ri.acdc(model, toks, metric, reference=ref, threshold=0.02, progress=False)
ev = ri.evaluate_circuit(model, toks, metric, run.circuit(), reference=ref)
print(fam, "ACDC kept", len(run.circuit()), "final", run.final, "evaluate_circuit", ev, "diff", run.final - ev)
eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=3)
curve = ri.faithfulness_curve(model, toks, metric, eap, reference=ref, fractions=(0.05, 0.2, 0.5), progress=False)
print("curve values", curve.values, "n_edges", curve.n_edges)
import inspect; print(inspect.signature(circuit_at))
L = eap.layout
for f, v in zip((0.05, 0.2, 0.5), curve.values):
    m = circuit_at(eap, f)
    edges = [(s, r) for i, s in enumerate(L.senders) for j, r in enumerate(L.receivers) if bool(m[i, j])]
    print(f, "curve", v, "evaluate_circuit", ri.evaluate_circuit(model, toks, metric, edges, reference=ref), len(edges))
