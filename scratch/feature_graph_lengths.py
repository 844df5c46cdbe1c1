"""The post-norm feature-graph test (tests/test_postnorm.py) on other prompt lengths and positions: P=1, P=2
position 0, float32. argv: family P position dtype"""
import sys
sys.path.insert(0, "/work/wt-red/tests")
import torch, pytest
import rs_interp as ri
from test_postnorm import _Frozen, _close, _backend
def feature_graph_check(model, P, position):
    """Every row of the graph (features' pre-activations, logits) is the frozen replacement model's, and a node's
    column is the change its write makes there: the post-norms' scales frozen with the rest."""
    from test_features import random_transcoders
    from test_features_graph import _rows

    from rs_interp.features import attribution_graph, mlp_transcoders

    if _backend.logit_softcap(model) is not None:
        with pytest.raises(ValueError, match="soft-capped logits"):
            attribution_graph(model, random_transcoders(model.cfg.n_layers, model.cfg.d_model, 8), torch.arange(5))
        return
    with pytest.raises(ValueError, match="post-norm blocks|not plain ReLU MLPs"):  # gated MLPs refused first
        mlp_transcoders(model)
    d, L = model.cfg.d_model, model.cfg.n_layers
    tcs = random_transcoders(L, d, 24, seed=2)
    tokens = torch.randint(0, 299, (P,), generator=torch.Generator().manual_seed(3))
    g = attribution_graph(model, tcs, tokens, targets=[0, 7, 21], position=position)
    bf = _Frozen(model, tcs, tokens).hand
    base = bf.targets(g, *bf.run())
    rows = _rows(g)
    _close(g.values[rows], base, model, "rows")
    kinds = g.kinds()
    feats = [n for n in range(g.n_features)][:4]
    for n in feats + [g.error_node(1, P - 1), g.token_node(P - 1)]:
        out_delta = torch.zeros(L, P, d, dtype=torch.float64)
        embed_delta = torch.zeros(P, d, dtype=torch.float64)
        if kinds[n] == "feature":
            l, p, f = g.features[n].tolist()
            out_delta[l, p] = g.activations[n] * tcs[l].W_dec[f]
        elif kinds[n] == "error":
            l, p = divmod(n - g.n_features, P)
            out_delta[l, p] = bf.out[l][p] - tcs[l](bf.x[l][p])
        else:
            embed_delta[n - g.token_node(0)] = bf.embed[n - g.token_node(0)]
        moved = bf.targets(g, *bf.run(embed_delta=embed_delta, out_delta=out_delta))
        _close(g.adjacency[rows, n], moved - base, model, f"node {g.labels()[n]}")



fam, P, pos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dt = getattr(torch, sys.argv[4] if len(sys.argv) > 4 else "float64")
model = ri.load_pretrained(f"/tmp/red_ckpt/{fam}", dtype=dt)
feature_graph_check(model, P, pos)
print(fam, "P", P, "position", pos, dt, "held")
