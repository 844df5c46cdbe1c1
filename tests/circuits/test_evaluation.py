"""Issue 30 item 4: circuits and faithfulness curves, exact."""

import warnings

import pytest
import torch

import rs_interp as ri
from tests.builders import TL4, architecture_params, ln1_by_hand, make_variant, variant_id


def metric(logits):
    return logits[:, -1].log_softmax(-1)[:, 3].mean() + 0.1 * logits[:, 2, 5].sum()


def _setup(variant=("LN", "standard", False), seed=1):
    model = make_variant(*variant, seed=seed, n_layers=3, n_heads=2)
    g = torch.Generator().manual_seed(seed)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (3, 8), generator=g) for _ in range(2))
    return model, toks, ref


VARIANTS = [("LN", "standard", False), ("RMSPre", "rotary", True), ("LNPre", "rotary", False)]


@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_full_circuit_is_the_clean_run_and_empty_the_reference_run(variant):
    model, toks, ref = _setup(variant)
    edges = ri.edge_layout(model).edges()
    with torch.no_grad():
        clean, reference_run = float(metric(model(toks))), float(metric(model(ref)))
    assert ri.evaluate_circuit(model, toks, metric, edges, reference=ref) == pytest.approx(clean, abs=1e-9)
    assert ri.evaluate_circuit(model, toks, metric, [], reference=ref) == pytest.approx(reference_run, abs=1e-9)
    assert ri.evaluate_circuit(model, toks, metric, edges, reference=ref, ablation="mean") == pytest.approx(clean, abs=1e-9)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1]}-{v[2]}")
def test_cutting_one_edge_is_path_patching_that_edge(variant):
    """With every other edge kept, everything upstream of the receiver is the clean run's, so cutting
    (s, r) is exactly patching that one edge: clean + path_patching's effect (an independent brute
    force, tests/circuits/test_path_patching.py)."""
    model, toks, ref = _setup(variant)
    pp = ri.path_patching(model, toks, metric, reference=ref)
    edges = pp.layout.edges()
    for cut in edges[:: max(1, len(edges) // 12)]:
        kept = [e for e in edges if e != cut]
        got = ri.evaluate_circuit(model, toks, metric, kept, reference=ref)
        assert got == pytest.approx(pp.clean + pp.edge(*cut), abs=1e-9), cut


@pytest.mark.parametrize("method", ["mean", "position_mean", "zero"])
def test_mean_and_zero_ablation_of_one_edge_by_hand(method):
    """Mean, per-position mean and zero ablation: the cut edge carries the sender's mean write over the
    reference batch and positions, its mean over the batch at each position, or nothing; checked against
    one hooked run written here (the embedding into the logits)."""
    model, toks, ref = _setup()
    box = {}
    with torch.no_grad():
        model.run_with_hooks(ref, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: box.update(ref=t.clone()))])
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", lambda t, hook: box.update(run=t.clone()))])
        ablated = {"mean": box["ref"].mean((0, 1), keepdim=True), "position_mean": box["ref"].mean(0, keepdim=True),
                   "zero": torch.zeros_like(box["run"])}[method]
        w = ablated - box["run"]
        want = float(metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.2.hook_resid_post", lambda t, hook: t + w)])))
    edges = [e for e in ri.edge_layout(model).edges() if e != ("embed", "logits")]
    assert ri.evaluate_circuit(model, toks, metric, edges, reference=ref, ablation=method) == pytest.approx(want, abs=1e-9)


def _on_a_path(layout, kept):
    """The kept edges that lie on some path from the embedding to the logits (written apart from the
    library's pruning: forward and backward reachability over the components)."""
    def component(r):
        return r.split(".")[0] if "." in r else r
    reach, changed = {"embed", "tok_embed", "pos_embed"}, True
    while changed:  # forward: a sender is reached when a kept edge from a reached sender enters it
        changed = False
        for s, r in kept:
            if s in reach and component(r) not in reach:
                reach.add(component(r))
                changed = True
    back, changed = {"logits"}, True
    while changed:  # backward: a sender reaches the logits when a kept edge leaves it into one that does
        changed = False
        for s, r in kept:
            if component(r) in back and s not in back:
                back.add(s)
                changed = True
    return [(s, r) for s, r in kept if s in reach and s in back and component(r) in back]


def _one_pass(kept):
    """What the Graph.prune of the EAP-IG commit MIB pins leaves after apply_topn (written apart, from its source):
    nodes_in_graph = nodes with an outgoing and an incoming kept edge (the input always has one), then the edges
    whose parent and child are in (the logits always are), once."""
    def component(r):
        return r.split(".")[0] if "." in r else r
    outgoing = {s for s, _ in kept}
    incoming = {component(r) for _, r in kept} | {"embed"}
    nodes = outgoing & incoming
    return [(s, r) for s, r in kept if s in nodes and (r == "logits" or component(r) in nodes)]


@pytest.mark.parametrize("higher_is_better", [False, True])
@pytest.mark.parametrize("ranking", ["absolute", "signed"])
def test_faithfulness_curve_is_mibs(ranking, higher_is_better):
    """MIB's evaluation, written apart: at each fraction f the top int(f * N) edges by |score| or by
    score (MIB's: the loss's score, -effect for a higher-is-better metric), pruned to those on a path
    from the embedding to the logits, evaluated; faithfulness against the clean and the reference run;
    the areas by the trapezoid rule (CPR: signed, CMD: absolute)."""
    model, toks, ref = _setup()
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    curve = ri.faithfulness_curve(model, toks, metric, eap, reference=ref, ranking=ranking, higher_is_better=higher_is_better)
    loss_sign = -1 if higher_is_better else 1
    layout = eap.layout
    total = layout.n_edges
    assert curve.fractions == ri.circuits.MIB_FRACTIONS
    assert curve.n_requested == tuple(int(f * total) for f in curve.fractions)
    flat = sorted(((float(eap.effect[i, j]), i * 1000 + j, (s, r)) for i, s in enumerate(layout.senders)
                   for j, r in enumerate(layout.receivers) if layout.exists[i, j]),
                  key=lambda x: (-(abs(x[0]) if ranking == "absolute" else loss_sign * x[0]), x[1]))
    assert curve.mib_counts == tuple(float(len(_one_pass([e for _, _, e in flat[:n]]))) for n in curve.n_requested)
    for n, kept_n, v in zip(curve.n_requested, curve.n_edges, curve.values):
        top = _on_a_path(layout, [e for _, _, e in flat[:n]])
        assert kept_n == len(top)
        assert v == pytest.approx(ri.evaluate_circuit(model, toks, metric, top, reference=ref), abs=1e-12)
    with torch.no_grad():
        full, empty = float(metric(model(toks))), float(metric(model(ref)))
    assert (curve.clean, curve.empty) == (pytest.approx(full, abs=1e-12), pytest.approx(empty, abs=1e-9))
    faith = torch.tensor([(v - empty) / (full - empty) for v in curve.values], dtype=torch.float64)
    x = torch.tensor(curve.fractions, dtype=torch.float64)
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-9)
    assert curve.area_under == pytest.approx(float(torch.trapezoid(faith, x)), abs=1e-9)
    assert curve.area_from_1 == pytest.approx(float(torch.trapezoid((1 - faith).abs(), x)), abs=1e-9)
    right, wrong = ("cpr", "cmd") if ranking == "signed" else ("cmd", "cpr")
    assert getattr(curve, right) == (curve.area_under if right == "cpr" else curve.area_from_1)
    with pytest.raises(ValueError, match="ranked by"):
        getattr(curve, wrong)


def _logit_diff(logits):
    """A logit difference (MIB's kind of metric), declaring no direction."""
    return (logits[:, -1, 3] - logits[:, -1, 5]).mean()


def test_one_default_direction_rs_interp_and_mibs_reading_of_its_file_agree(tmp_path):
    """Issue 61 item 5: with every default, the same logit-difference scores give one CPR in rs_interp and in
    MIB's reading of the file rs_interp writes (MIB ranks a file's scores largest first: the curve of those
    scores, signed, ranked as a loss's: higher_is_better=False). Before, the defaults disagreed (mib_scores
    ranked as for a loss, write_mib wrote MIB's convention): the explicit False below is that old default."""
    model, toks, ref = _setup()
    eap = ri.edge_attribution_patching(model, toks, _logit_diff, reference=ref)
    ours = ri.mib_scores(model, toks, _logit_diff, eap, reference=ref, progress=False)
    path = ri.circuits.write_mib(tmp_path / "importances.json", model, scores=eap)
    theirs = ri.faithfulness_curve(model, toks, _logit_diff, ri.circuits.read_mib(path, model).scores, reference=ref,
                                   ranking="signed", higher_is_better=False, progress=False)
    assert ours.signed.clean > ours.signed.empty  # so the rule reads: higher is better
    assert (ours.signed.higher_is_better, ours.signed.direction_from) == (True, "clean and empty")
    assert ours.cpr == pytest.approx(theirs.area_under, abs=1e-12)
    old = ri.mib_scores(model, toks, _logit_diff, eap, reference=ref, higher_is_better=False, progress=False)
    assert old.signed.direction_from == "argument" and abs(old.cpr - ours.cpr) > 1e-3  # the disagreement the issue measured


def test_the_direction_comes_from_the_argument_then_the_metric_then_the_runs():
    """The one rule (rs_interp.metrics.direction): an explicit argument wins over the metric's declaration
    (a task's metric: True; next_token_loss: False), which wins over the clean and empty runs; stated in the curve."""
    from rs_interp.metrics import declare_direction

    model, toks, ref = _setup()
    eap = ri.edge_attribution_patching(model, toks, _logit_diff, reference=ref)
    kw = dict(reference=ref, ranking="signed", fractions=(0.1, 0.5, 1.0), progress=False)
    by_runs = ri.faithfulness_curve(model, toks, _logit_diff, eap, **kw)
    flipped = declare_direction(lambda logits: _logit_diff(logits), False)  # declared against what the runs say
    declared = ri.faithfulness_curve(model, toks, flipped, eap, **kw)
    given = ri.faithfulness_curve(model, toks, flipped, eap, higher_is_better=True, **kw)
    assert (by_runs.higher_is_better, by_runs.direction_from) == (True, "clean and empty")
    assert (declared.higher_is_better, declared.direction_from) == (False, "metric")
    assert (given.higher_is_better, given.direction_from) == (True, "argument")
    assert given.values == by_runs.values and declared.values != by_runs.values
    loss = ri.next_token_loss(ri.next_token_targets(toks))
    assert ri.faithfulness_curve(model, toks, loss, eap, **kw).direction_from == "metric"
    assert ri.tasks.induction_task(2, seed=0).metric().higher_is_better is True and loss.higher_is_better is False
    with pytest.raises(ValueError, match="higher_is_better must be True, False or None"):
        ri.faithfulness_curve(model, toks, _logit_diff, eap, higher_is_better=1, **kw)


def test_mib_scores_of_several_results_are_each_ones_own():
    """Several methods' curves computed together (each distinct circuit run once) give, to the bit,
    what one call per method gives; an empty mapping is refused."""
    model, toks, ref = _setup()
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    ig = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=3)
    pp = ri.path_patching(model, toks, metric, reference=ref, progress=False)
    together = ri.mib_scores(model, toks, metric, {"eap": eap, "ig": ig, "pp": pp}, reference=ref, progress=False)
    for name, scores in (("eap", eap), ("ig", ig), ("pp", pp)):
        alone = ri.mib_scores(model, toks, metric, scores, reference=ref, progress=False)
        assert together[name] == alone, name
    with pytest.raises(ValueError, match="empty mapping"):
        ri.mib_scores(model, toks, metric, {}, reference=ref)


def test_top_edges_and_bad_input():
    model, toks, ref = _setup()
    pp = ri.path_patching(model, toks, metric, reference=ref)
    assert ri.top_edges(pp, 3) == [edge for edge, _ in pp.top(3)]
    assert ri.top_edges(pp, 0) == [] and len(ri.top_edges(pp, pp.layout.n_edges)) == pp.layout.n_edges
    for bad in (-1, 2.5, "3", pp.layout.n_edges + 1):
        with pytest.raises(ValueError, match="k must"):
            ri.top_edges(pp, bad)
    with pytest.raises(ValueError, match="fractions"):
        ri.faithfulness_curve(model, toks, metric, pp, reference=ref, fractions=(0.5, 0.2))
    with pytest.raises(ValueError, match="fractions"):
        ri.faithfulness_curve(model, toks, metric, pp, reference=ref, fractions="0.5")
    other = ri.path_patching(make_variant("LN", "standard", True, n_layers=2), toks, metric, reference=ref)
    with pytest.raises(ValueError, match="edge layout"):
        ri.faithfulness_curve(model, toks, metric, other, reference=ref)
    with pytest.raises(ValueError, match="not an edge"):
        ri.evaluate_circuit(model, toks, metric, [("L2H0", "L0H0.q")], reference=ref)
    with pytest.raises(ValueError, match="entries must be"):
        ri.evaluate_circuit(model, toks, metric, [("embed", "logits", "x")], reference=ref)
    with pytest.raises(ValueError, match="entries must be"):
        ri.evaluate_circuit(model, toks, metric, ("embed", "logits"), reference=ref)  # one pair, not a list of pairs
    with pytest.raises(ValueError, match="ablation"):
        ri.evaluate_circuit(model, toks, metric, [], reference=ref, ablation="shuffle")
    with pytest.raises(ValueError, match="must be finite"):
        ri.evaluate_circuit(model, toks, lambda lg: lg.sum() * float("nan"), [], reference=ref)
    with pytest.warns(UserWarning, match="no path from the embedding"):
        ri.evaluate_circuit(model, toks, metric, [("embed", "L0H0.q")], reference=ref)


def test_dangling_circuit_warning_points_at_the_callers_line():
    """The warning names the caller's file, not rs_interp's keyword wrapper (``_keywords.renamed`` sits
    between the caller and evaluate_circuit since issue 51: stacklevel=2 pointed at the wrapper)."""
    model, toks, ref = _setup()
    with pytest.warns(UserWarning, match="no path from the embedding") as caught:
        ri.evaluate_circuit(model, toks, metric, [("embed", "L0H0.q")], reference=ref)
    assert [w.filename for w in caught] == [__file__]


def _on_a_path_gqa(layout, kept, n_heads, n_kv):
    """The kept edges on a path embed -> logits, by reachability (written apart from selection.prune)."""
    group = n_heads // n_kv if n_kv else 1

    def component(receiver):  # what a receiver's input feeds: "L1H0.q" -> L1H0, "L1KV0.k" -> L1KV0
        return receiver.split(".")[0]

    def fed_by(sender):  # the components whose inputs make a sender's output
        if sender == "embed" or not sender.startswith("L") or "H" not in sender:
            return {sender}
        layer, head = sender[1:].split("H")
        return {sender} | ({f"L{layer}KV{int(head) // group}"} if n_kv else set())

    reached, reaches = {"embed"}, {"logits"}
    for _ in range(len(layout.senders) + 2):  # fixed points
        reached |= {component(r) for s, r in kept if s in reached or fed_by(s) & reached}
        reaches |= {s for s, r in kept if component(r) in reaches}
        reaches |= {c for s in reaches for c in fed_by(s)}
    return [(s, r) for s, r in kept if (s == "embed" or fed_by(s) & reached) and component(r) in reaches]


@pytest.mark.parametrize("variant", [("LN", "standard", False, None), ("RMS", "rotary", False, "gqa")], ids=lambda v: str(v[3]))
@pytest.mark.parametrize("n", [1, 3, 8, 20])
def test_pruned_top_edges_are_the_ones_on_a_path_from_embed_to_logits(variant, n):
    """``top_edges(..., pruned=True)``: the top ``n`` (rank order kept) on an embed -> logits path."""
    model = make_variant(*variant, n_layers=3, n_heads=2, seed=n)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(i)) for i in (0, 1))
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    top = ri.top_edges(eap, n)
    n_kv = model.cfg.n_key_value_heads or 0
    assert ri.top_edges(eap, n, pruned=True) == _on_a_path_gqa(eap.layout, top, model.cfg.n_heads, n_kv if n_kv != model.cfg.n_heads else 0)
    # by hand: a dangling edge first, then a connected one
    effect = torch.where(eap.layout.exists, 0.0, float("nan")).double()
    effect[eap.layout.index(("embed", "L0H0.q"))] = 2.0  # L0H0 writes nowhere kept
    effect[eap.layout.index(("embed", "logits"))] = 1.0
    hand = ri.circuits.EdgeEffects(eap.layout, effect, eap.clean)
    assert ri.top_edges(hand, 2) == [("embed", "L0H0.q"), ("embed", "logits")]
    assert ri.top_edges(hand, 2, pruned=True) == [("embed", "logits")]
    with pytest.raises(ValueError, match="pruned"):
        ri.top_edges(hand, 2, pruned="yes")


def test_faithfulness_figure():
    from rs_interp.ui import plots

    model, toks, ref = _setup()
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    curves = {"EAP": ri.faithfulness_curve(model, toks, metric, eap, reference=ref, fractions=(0.1, 0.5, 1.0))}
    fig = plots.faithfulness_figure(curves)
    (trace,) = fig.data
    assert list(trace.x) == [10.0, 50.0, 100.0] and list(trace.y) == list(curves["EAP"].faithfulness)
    assert f"CMD {curves['EAP'].cmd:.3f}" in trace.name
    with pytest.raises(ValueError, match="empty"):
        plots.faithfulness_figure({})


def _brute_force_circuit(model, toks, ref, kept, method):
    """The metric with every edge outside ``kept`` ablated, written apart from the library: one hooked
    run that records each sender's ``ablated - write`` as it fires and adds the cut ones to each
    receiver's input, head by head. A head's input goes in through TransformerLens's own per-head
    inputs on 3.x (``use_split_qkv_input``); on 4.x's native attention, which has none, its q/k/v is
    recomputed from the moved input by hand (the first norm written out, then its own W and b)."""
    cfg, layout = model.cfg, ri.edge_layout(model)
    cut = set(layout.edges()) - set(kept)
    into: dict[str, list[str]] = {}
    for s, r in cut:
        into.setdefault(r, []).append(s)
    points = lambda n: n == "blocks.0.hook_resid_pre" or n.endswith("attn.hook_z") or n.endswith("hook_mlp_out")  # noqa: E731
    box = {}
    with torch.no_grad():
        model.run_with_hooks(ref, fwd_hooks=[(points, lambda t, hook: box.update({hook.name: t.clone()}))])
    if method == "mean":
        box = {k: v.mean((0, 1), keepdim=True).expand(toks.shape[0], toks.shape[1], *v.shape[2:]) for k, v in box.items()}
    delta, stream = {}, {}

    def moved(receiver, t):
        return t + sum((delta[s] for s in into.get(receiver, [])), torch.zeros_like(t))

    def resid_pre(t, hook):
        layer = int(hook.name.split(".")[1])
        stream[layer] = t
        if layer == 0:
            delta["embed"] = box[hook.name] - t

    def z(t, hook):
        layer = int(hook.name.split(".")[1])
        W_O = model.blocks[layer].attn.W_O
        for h in range(cfg.n_heads):
            delta[f"L{layer}H{h}"] = (box[hook.name][:, :, h] - t[:, :, h]) @ W_O[h]

    def mlp_out(t, hook):
        delta[f"MLP{hook.name.split('.')[1]}"] = box[hook.name] - t

    def head_labels(layer, kind, n):
        return [f"L{layer}H{i}.{kind}" if n == cfg.n_heads else f"L{layer}KV{i}.{kind}" for i in range(n)]

    def split_input(t, hook):  # 3.x: (batch, pos, head or KV head, d_model)
        layer, kind = int(hook.name.split(".")[1]), hook.name.split("_")[-2]
        labels = head_labels(layer, kind, t.shape[2])
        return torch.stack([moved(lab, t[:, :, i]) for i, lab in enumerate(labels)], 2)

    def projection(t, hook):  # 4.x's native attention: (batch, pos, head or KV head, d_head)
        layer, kind = int(hook.name.split(".")[1]), hook.name[-1]
        attn, out = model.blocks[layer].attn, t.clone()
        W, b = getattr(attn, f"W_{kind.upper()}"), getattr(attn, f"b_{kind.upper()}")
        step = W.shape[0] // t.shape[2]
        for i, lab in enumerate(head_labels(layer, kind, t.shape[2])):
            if into.get(lab):
                out[:, :, i] = ln1_by_hand(model, layer, moved(lab, stream[layer])) @ W[i * step] + (0 if b is None else b[i * step])
        return out

    last = f"blocks.{cfg.n_layers - 1}.hook_resid_post"
    fwd = [(lambda n: n.endswith("hook_resid_pre"), resid_pre), (lambda n: n.endswith("attn.hook_z"), z),
           (last, lambda t, hook: moved("logits", t))]
    if not cfg.attn_only:
        fwd += [(lambda n: n.endswith("hook_mlp_out"), mlp_out),
                (lambda n: n.endswith("hook_mlp_in"), lambda t, hook: moved(f"MLP{hook.name.split('.')[1]}", t))]
    if TL4:
        fwd.append((lambda n: n.split(".")[-1] in ("hook_q", "hook_k", "hook_v") and ".attn." in n, projection))
    else:
        fwd.append((lambda n: n.split(".")[-1] in ("hook_q_input", "hook_k_input", "hook_v_input"), split_input))
    saved = (cfg.use_split_qkv_input, getattr(cfg, "use_hook_mlp_in", True))
    try:
        if not TL4:
            model.set_use_split_qkv_input(True)
        if not cfg.attn_only:
            model.set_use_hook_mlp_in(True)
        with torch.no_grad():
            return float(metric(model.run_with_hooks(toks, fwd_hooks=fwd)))
    finally:
        if not TL4:
            model.set_use_split_qkv_input(saved[0])
        if not cfg.attn_only:
            model.set_use_hook_mlp_in(saved[1])


def _mixed_circuits(layout, seed):
    """Circuits whose receivers have every incoming edge cut, none, or some (per receiver at random,
    in three proportions), so the heads of a layer read the fully ablated input, the run's own, or
    their own mix: empty, full, random fractions and the three mixes."""
    g = torch.Generator().manual_seed(seed)
    edges = layout.edges()
    out = [[], edges]
    for frac in (0.02, 0.3, 0.7):
        out.append([edges[i] for i in torch.randperm(len(edges), generator=g)[: int(frac * len(edges))].tolist()])
    for p_all, p_none in ((0.6, 0.3), (0.3, 0.6), (0.2, 0.2)):
        mode = {r: float(torch.rand((), generator=g)) for r in layout.receivers}
        out.append([(s, r) for s, r in edges if mode[r] >= p_all and (mode[r] >= 1 - p_none or bool(torch.rand((), generator=g) < 0.5))])
    return out


@pytest.mark.parametrize("method", ["resample", "mean"])
@pytest.mark.parametrize("variant", [*VARIANTS, *architecture_params()], ids=variant_id)
def test_circuits_of_every_size_by_hand(variant, method):
    """evaluate_circuit and faithfulness_curve against a brute force written here
    (:func:`_brute_force_circuit`) on circuits where a layer's heads read the fully ablated input,
    the run's own or their own mix (the grouping of equal inputs the evaluation does), to 1e-12."""
    model = make_variant(*variant, seed=1, n_layers=3, n_heads=4)
    g = torch.Generator().manual_seed(2)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (3, 8), generator=g) for _ in range(2))
    layout = ri.edge_layout(model)
    for kept in _mixed_circuits(layout, seed=3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dangling circuits warn
            got = ri.evaluate_circuit(model, toks, metric, kept, reference=ref, ablation=method)
        assert got == pytest.approx(_brute_force_circuit(model, toks, ref, kept, method), rel=1e-12, abs=1e-12), len(kept)
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, progress=False)
    curve = ri.faithfulness_curve(model, toks, metric, eap, reference=ref, ablation=method, progress=False)
    for f, value in zip(curve.fractions, curve.values):
        keep = ri.circuits.selection.circuit_at(eap, f)
        kept = [(s, r) for i, s in enumerate(layout.senders) for j, r in enumerate(layout.receivers) if keep[i, j]]
        assert value == pytest.approx(_brute_force_circuit(model, toks, ref, kept, method), rel=1e-12, abs=1e-12), f
    assert curve.empty == pytest.approx(_brute_force_circuit(model, toks, ref, [], method), rel=1e-12, abs=1e-12)


# --- the input node as EAP-IG defines it (issue 53 item 3) -------------------------------------------

def _standard_model():
    model = make_variant("LN", "standard", False, seed=4, n_layers=2, n_heads=2)
    g = torch.Generator().manual_seed(4)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (3, 6), generator=g) for _ in range(2))
    return model, toks, ref


def test_edge_layout_embeddings():
    model, _, _ = _standard_model()
    layouts = {e: ri.edge_layout(model, embedding=e) for e in ("sum", "split", "token")}
    assert layouts["sum"].senders[0] == "embed" and layouts["token"].senders[0] == "tok_embed"
    assert layouts["split"].senders[:2] == ("tok_embed", "pos_embed")
    n_receivers = len(layouts["sum"].receivers)  # an input sender feeds every receiver
    assert layouts["token"].n_edges == layouts["sum"].n_edges
    assert layouts["split"].n_edges == layouts["sum"].n_edges + n_receivers
    for e, layout in layouts.items():
        assert ri.circuits.graph.embedding_of(layout) == e
    with pytest.raises(ValueError, match="embedding must be"):
        ri.edge_layout(model, embedding="tokens")
    with pytest.raises(ValueError, match="no position embedding"):
        ri.edge_layout(make_variant("RMSPre", "rotary", True, seed=0, n_layers=1, n_heads=2), embedding="split")


def _hooked(model, toks, name, value):
    """The metric with the hook point ``name`` replaced by ``value(t)`` (a plain TransformerLens hook: apart from
    the library's circuit runs)."""
    with torch.no_grad(), model.hooks(fwd_hooks=[(name, lambda t, hook: value(t))]):
        return float(metric(model(toks)))


@pytest.mark.parametrize("method", ["zero", "mean", "position_mean"])
@pytest.mark.parametrize("embedding, sender, hook", [("token", "tok_embed", "hook_embed"), ("split", "tok_embed", "hook_embed"),
                                                      ("split", "pos_embed", "hook_pos_embed"), ("sum", "embed", "blocks.0.hook_resid_pre")])
def test_cutting_an_input_sender_is_ablating_its_hook(embedding, sender, hook, method):
    """Every outgoing edge of an input sender cut = that sender's hook ablated in the model's own run (a zero,
    the reference's mean over the batch and positions, or per position)."""
    model, toks, ref = _standard_model()
    layout = ri.edge_layout(model, embedding=embedding)
    kept = [e for e in layout.edges() if e[0] != sender]
    with warnings.catch_warnings():  # the summed or token input cut: no path from an input (it warns so), still a run
        warnings.simplefilter("ignore")
        got = ri.evaluate_circuit(model, toks, metric, kept, reference=ref, ablation=method, embedding=embedding)
    with torch.no_grad():
        _, cache = model.run_with_cache(ref, names_filter=hook)
    a = cache[hook]
    if method == "zero":
        want = _hooked(model, toks, hook, torch.zeros_like)
    elif method == "mean":
        want = _hooked(model, toks, hook, lambda t: a.mean((0, 1), keepdim=True).expand_as(t).clone())
    else:
        want = _hooked(model, toks, hook, lambda t: a.mean(0, keepdim=True).expand_as(t).clone())
    assert got == pytest.approx(want, abs=1e-9)


def test_faithfulness_curve_on_the_token_input():
    model, toks, ref = _standard_model()
    layout = ri.edge_layout(model, embedding="token")
    effect = torch.randn(layout.exists.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    scores = ri.circuits.EdgeEffects(layout, torch.where(layout.exists, effect, torch.nan), float("nan"))
    curve = ri.faithfulness_curve(model, toks, metric, scores, reference=ref, ablation="zero", progress=False, fractions=(0.2, 1.0))
    edges = [layout.edges()[i] for i in scores.ranked()[: curve.n_requested[0]]]
    kept = _on_a_path(layout, edges)
    assert curve.values[0] == pytest.approx(ri.evaluate_circuit(model, toks, metric, kept, reference=ref, ablation="zero",
                                                                embedding="token"), abs=1e-12)
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("embedding", ["token", "split"])
def test_effects_on_the_token_input_are_the_summed_inputs(embedding):
    """Against a reference at the same positions, cutting (tok_embed, r) is cutting (embed, r) and cutting (pos_embed, r)
    changes nothing: EdgeEffects.on_inputs, checked edge by edge with evaluate_circuit on both graphs."""
    model, toks, ref = _standard_model()
    pp = ri.path_patching(model, toks, metric, reference=ref)
    moved = pp.on_inputs(embedding)
    want = ri.edge_layout(model, embedding=embedding)
    assert (moved.layout.senders, moved.layout.receivers) == (want.senders, want.receivers)
    assert torch.equal(moved.layout.exists, want.exists)
    every, summed = moved.layout.edges(), pp.layout.edges()
    clean = ri.evaluate_circuit(model, toks, metric, summed, reference=ref)
    for r in ("L0H1.v", "L1H0.q", "MLP0", "logits"):
        for s in ri.circuits.graph.EMBEDDINGS[embedding]:
            got = ri.evaluate_circuit(model, toks, metric, [e for e in every if e != (s, r)], reference=ref, embedding=embedding)
            assert got - clean == pytest.approx(moved.edge(s, r), abs=1e-9)
    with pytest.raises(ValueError, match="summed input"):
        moved.on_inputs("sum")


@pytest.mark.parametrize("H", [4, 1])  # a layer of one head is still a block of heads
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_of_sender_differences_are_the_float64_sums(dtype, H):
    """The circuit run keeps each layer's head differences as ``dz`` with one float64 sum ``F``
    (``_ablated_run._Differences``, issue 50: GPT-2 small's 157 float64 differences were 0.65 GB):
    every column of cut senders (every subset of a layer's heads, either way it is formed, a head that
    moves nothing, input and MLP senders) sums to the brute force over the materialised float64
    ``D_s = ablated_s - write_s`` to 1e-12, and the all-cut column to the running total."""
    from itertools import product

    from rs_interp.circuits._ablated_run import _Differences

    g = torch.Generator().manual_seed(0)
    B, P, dh, d = 2, 3, 5, 6
    W_O = [torch.randn(H, dh, d, generator=g, dtype=dtype) for _ in range(2)]
    dz = [torch.randn(B, P, H, dh, generator=g, dtype=dtype) for _ in range(2)]
    dz[1][:, :, H - 1] = 0  # a head that moves nothing
    one = [torch.randn(B, P, d, generator=g, dtype=dtype) for _ in range(2)]
    moves = torch.zeros(2 + 2 * H, dtype=torch.float64)
    diffs = _Differences(moves)
    D = []  # the brute force: every sender's float64 difference, in order
    for k in range(2):
        diffs.add_one(one[k])
        D.append(one[k].to(torch.float64))
        diffs.add_heads(dz[k], W_O[k])
        D += [dz[k][:, :, h].to(torch.float64) @ W_O[k][h].to(torch.float64) for h in range(H)]
    D = torch.stack(D)
    assert diffs.filled == len(D) and moves[1 + H + 1 + H - 1] == 0 and int(moves.sum()) == len(D) - 1  # that head alone
    for bits in product([0.0, 1.0], repeat=len(D)):
        w = torch.tensor(bits, dtype=torch.float64) * moves
        if not bool(w.any()):
            continue
        want = torch.einsum("sbpm,s->bpm", D, w)
        torch.testing.assert_close(diffs.sum(w), want, rtol=1e-12, atol=1e-12)
    assert torch.equal(diffs.sum(moves.clone()), diffs.full)
