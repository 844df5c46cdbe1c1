"""Issue 30 item 6: rs_interp beside TransformerLens's own analysis tools, on the same models and pairs.

The conventions, mapped: TransformerLens's tools take ``(clean, corrupt)`` and score in the denoising
direction (the gradient at the corrupt run, ``a_clean - a_corrupt``), per position, averaged over the
pairs (each pair in a pass of its own); rs_interp's run is ``tokens``, the patch comes from
``reference``, summed over the batch and the positions. So ours runs on ``corrupt`` with
``reference=clean``, TransformerLens's per-position scores are summed over positions, and the metric
is the batch mean of a per-example logit difference (our sum over the batch is then its mean over pairs).
TransformerLens's direct path patching returns the patched metric: minus the corrupt run's, it is our
effect. Its faithfulness ``recovered`` is ``(m_circuit - m_corrupt) / (m_clean - m_corrupt)`` with our
circuit run on clean, resample-ablated from corrupt, its circuit being our edges at every position.

What TransformerLens accepts:

- attention-only models: ``attribution_patch`` refuses them on 3.9 and 4.3 (its node graph requires
  ``hook_mlp_out``), asserted below;
- 4.3's native bridges (every model built from a config, as ``gpt2_tiny``): node attribution only;
  edges, faithfulness and direct path patching raise NotImplementedError (``NativeAttention`` has no
  per-head result or split q/k/v inputs), asserted below. They run on a bridge over Hugging Face GPT-2
  attention (``hf_model``: 3.x loads the same checkpoint as a HookedTransformer);
- 3.9: ``attribution_patch`` is node-only and there is no ``faithfulness``; its
  ``get_act_patch_direct_path`` is a frozen-LayerNorm-scale linearisation, not the edge patch: shown
  against hand-written runs below (4.x computes the exact patch and equals ours).

Tolerance: 1e-5 absolute, float32 models. The largest numbers compared are of order 1 (node and edge
scores up to 1.5, recovered fractions up to 2, metrics ~1), direct path effects up to 0.07; each test
asserts its largest number is above 0.01, so none passes on zeros. Measured differences: at most 2.3e-6.
Time (OMP_NUM_THREADS=1, 2 shared cores): pytest reports about 6 s under 4.3 and 4 s under 3.9, above
the ~13 s every standalone run spends starting (a --collect-only run).
"""

import warnings
from collections import defaultdict

import pytest
import torch
from transformer_lens.tools.analysis import attribution_patching as tl

import rs_interp as ri
from rs_interp import _backend
from tests.builders import TL4, ln1_by_hand, tl3_only

TOL = 1e-5
N_PAIRS, N_POS = 3, 7

tl4_only = lambda why: pytest.mark.skipif(not TL4, reason=f"TransformerLens {_backend.TL_VERSION}: {why} (checked on 4.x)")  # noqa: E731
NO_EDGES = tl4_only("tools.analysis.attribution_patch has no edge granularity (EdgeAttributionConfig(granularity='edge') raises NotImplementedError)")
NO_FAITHFULNESS = tl4_only("tools.analysis has no faithfulness")
LINEARISED = tl4_only("get_act_patch_direct_path is a frozen-LayerNorm-scale linearisation, not the edge patch "
                      "(test_tl3_direct_path_is_a_frozen_scale_linearisation)")


def metric(logits):
    """Per example a logit difference at the last position; the batch mean (TransformerLens calls it on one pair)."""
    return (logits[:, -1, 3] - logits[:, -1, 7]).mean()


def direct_path_tool():
    if TL4:
        from transformer_lens.patching import get_act_patch_direct_path  # 4.x's home (tools.analysis warns)
    else:
        from transformer_lens.tools.analysis import get_act_patch_direct_path
    return get_act_patch_direct_path


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    """Three layers of Hugging Face GPT-2 (random, every bias and gain nonzero), loaded unfolded: on 4.x a
    bridge over ``JointQKVAttentionBridge``, which TransformerLens's edge tools need; on 3.x a HookedTransformer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=300, n_positions=32,
                                        initializer_range=0.2)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif ".ln_" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    path = tmp_path_factory.mktemp("hf_gpt2")
    hf.save_pretrained(path)
    return str(path)


def load(path, fold_ln=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ri.load_gpt2(path, fold_ln=fold_ln)


@pytest.fixture(scope="module")
def hf_model(hf_gpt2):
    return load(hf_gpt2)


def pairs(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, model.cfg.d_vocab, (N_PAIRS, N_POS), generator=g) for _ in range(2))


def label(node) -> str:
    """TransformerLens's Node -> our sender or receiver label (its position dropped)."""
    if node.kind == "embed":
        return "embed"
    if node.kind == "logits":
        return "logits"
    if node.kind in ("mlp_out", "mlp_in"):
        return f"MLP{node.layer}"
    suffix = "" if node.kind == "attn_head_out" else "." + node.kind[0]  # q_input -> .q
    return f"L{node.layer}H{node.head}{suffix}"


def node(text: str, position: int, *, reader: bool, n_layers: int):
    """Our label -> TransformerLens's Node at ``position`` (the other way)."""
    if text == "embed":
        return tl.Node("embed", position)
    if text == "logits":
        return tl.Node("logits", position, layer=n_layers - 1)
    if text.startswith("MLP"):
        return tl.Node("mlp_in" if reader else "mlp_out", position, layer=int(text[3:]))
    head, _, x = text.partition(".")
    l, h = (int(v) for v in head[1:].split("H"))
    return tl.Node(f"{x}_input" if x else "attn_head_out", position, layer=l, head=h)


@pytest.mark.parametrize("name", ["gpt2_tiny", "hf_model"])
def test_node_estimates_equal_transformer_lens(name, request):
    model = request.getfixturevalue(name)
    clean, corrupt = pairs(model)
    theirs = tl.attribution_patch(model, clean, corrupt, metric).node_scores
    heads = ri.attribution_patching(model, corrupt, metric, reference=clean).effect_per_position  # (layer, head, pos)
    eap = ri.edge_attribution_patching(model, corrupt, metric, reference=clean)
    ours = dict(zip(eap.layout.senders, eap.sender_totals().tolist()))  # embed, heads, MLPs: each its whole write
    summed = defaultdict(float)
    for n, v in theirs.items():
        summed[label(n)] += v
    assert set(summed) == set(ours) and len(theirs) == len(ours) * N_POS
    head_diff = max(abs(float(heads[n.layer, n.head, n.position]) - v) for n, v in theirs.items() if n.kind == "attn_head_out")
    sender_diff = max(abs(ours[s] - summed[s]) for s in ours)
    assert max(map(abs, summed.values())) > 0.05
    assert head_diff <= TOL and sender_diff <= TOL, (head_diff, sender_diff)


def test_attention_only_models_are_refused_by_transformer_lens():
    """TransformerLens's node graph requires every layer's ``hook_mlp_out``: an attention-only model has none
    (3.9: the hook exists but never fires; 4.3: no such hook). Ours runs on it."""
    model = ri.models.make_attn_only(2, n_heads=2, seed=0)
    clean, corrupt = pairs(model)
    with pytest.raises(ValueError, match="hook_mlp_out"):
        tl.attribution_patch(model, clean, corrupt, metric)
    assert ri.attribution_patching(model, corrupt, metric, reference=clean).effect.isfinite().all()


@tl4_only("3.9 has no edge granularity or faithfulness to refuse")
def test_native_bridges_are_refused_by_transformer_lens_edge_tools(gpt2_tiny):
    """4.3's NativeAttention has no per-head result nor split q/k/v inputs (rs_interp emulates the inputs)."""
    clean, corrupt = pairs(gpt2_tiny)
    _, cc = gpt2_tiny.run_with_cache(clean)
    _, kc = gpt2_tiny.run_with_cache(corrupt)
    with pytest.raises(NotImplementedError, match="use_attn_result"):
        tl.attribution_patch(gpt2_tiny, clean, corrupt, metric, tl.EdgeAttributionConfig(granularity="edge"))
    with pytest.raises(NotImplementedError, match="use_attn_result"):
        tl.faithfulness(gpt2_tiny, clean[:1], corrupt[:1], metric, [])
    with pytest.raises(NotImplementedError, match="use_split_qkv_input"):
        direct_path_tool()(gpt2_tiny, corrupt, cc, kc, metric, 0, 0, "q", verbose=False)


@tl3_only("tools.analysis has edge granularity and faithfulness")
def test_tl3_lacks_edges_and_faithfulness():
    """What the 4.x-only tests skip for on 3.x, checked to be so."""
    with pytest.raises(NotImplementedError, match="edge"):
        tl.EdgeAttributionConfig(granularity="edge")
    assert not hasattr(tl, "faithfulness")


@NO_EDGES
def test_edge_estimates_equal_transformer_lens(hf_model):
    model = hf_model
    L = model.cfg.n_layers
    clean, corrupt = pairs(model)
    theirs = tl.attribution_patch(model, clean, corrupt, metric, tl.EdgeAttributionConfig(granularity="edge")).edge_scores
    ours = ri.edge_attribution_patching(model, corrupt, metric, reference=clean)
    edges = ours.layout.edges()
    # Theirs -> ours: the same edge set, each at every position (writer and reader at one position).
    assert all(w.position == r.position for w, r in theirs)
    assert {(label(w), label(r)) for w, r in theirs} == set(edges) and len(theirs) == len(edges) * N_POS
    # Ours -> theirs: each edge's sum over positions, looked up by Node.
    summed = {(s, r): sum(theirs[node(s, p, reader=False, n_layers=L), node(r, p, reader=True, n_layers=L)]
                          for p in range(N_POS)) for s, r in edges}
    diff = max(abs(ours.edge(s, r) - v) for (s, r), v in summed.items())
    assert max(map(abs, summed.values())) > 0.05
    assert diff <= TOL, diff


SOURCES = [(0, 1), (1, 2)]


@LINEARISED
@pytest.mark.parametrize("component", "qkv")
@pytest.mark.parametrize("source", SOURCES, ids=lambda s: f"L{s[0]}H{s[1]}")
def test_direct_path_equals_transformer_lens(hf_model, source, component):
    model = hf_model
    (sl, sh), L, H = source, model.cfg.n_layers, model.cfg.n_heads
    clean, corrupt = pairs(model)
    _, cc = model.run_with_cache(clean)
    _, kc = model.run_with_cache(corrupt)
    theirs = direct_path_tool()(model, corrupt, cc, kc, metric, sl, sh, component, verbose=False)  # patched metric
    dests = [(dl, dh) for dl in range(sl + 1, L) for dh in range(H)]
    ours = ri.path_patching(model, corrupt, metric, reference=clean, edges=[(f"L{sl}H{sh}", f"L{dl}H{dh}.{component}") for dl, dh in dests])
    effects = [float(theirs[dl, dh]) - ours.clean for dl, dh in dests]
    diff = max(abs(ours.edge(f"L{sl}H{sh}", f"L{dl}H{dh}.{component}") - e) for (dl, dh), e in zip(dests, effects))
    assert max(map(abs, effects)) > 0.01
    assert diff <= TOL, diff


def _head_input_run(model, tokens, layer, head, component, edit):
    """metric with head ``head``'s ``hook_{component}`` replaced by ``edit(t[:, :, head], resid_pre)`` (plain hooks)."""
    box = {}

    def project(t, hook):
        t = t.clone()
        t[:, :, head] = edit(t[:, :, head], box)
        return t

    hooks = [(f"blocks.{layer}.hook_resid_pre", lambda t, hook: box.update(x=t)),
             (f"blocks.{layer}.ln1.hook_scale", lambda t, hook: box.update(scale=t)),
             (f"blocks.{layer}.attn.hook_{component}", project)]
    with torch.no_grad():
        return float(metric(model.run_with_hooks(tokens, fwd_hooks=hooks)))


@tl3_only("get_act_patch_direct_path computes the exact edge patch from 4.0 on (test_direct_path_equals_transformer_lens)")
@pytest.mark.parametrize("fold_ln", [False, True], ids=["unfolded", "folded"])
def test_tl3_direct_path_is_a_frozen_scale_linearisation(hf_gpt2, fold_ln):
    """TransformerLens 3.9's direct path patching adds ``(delta / ln1_scale_corrupt) @ W[dst]`` to the
    destination's q/k/v: no centring, no LayerNorm gain (unless folded), the corrupt run's scale kept
    frozen. Hand-written runs show ours is the exact patch (LayerNorm recomputed on ``resid_pre + delta``)
    and 3.9's is that linearisation, off by far more than float precision even on a folded model."""
    model = load(hf_gpt2, fold_ln=fold_ln)
    (sl, sh), component, L, H = (0, 1), "k", model.cfg.n_layers, model.cfg.n_heads
    clean, corrupt = pairs(model)
    _, cc = model.run_with_cache(clean)
    _, kc = model.run_with_cache(corrupt)
    z = f"blocks.{sl}.attn.hook_z"
    delta = (cc[z] - kc[z])[:, :, sh] @ model.blocks[sl].attn.W_O[sh]
    corrupt_metric = float(metric(model(corrupt).detach()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3.9 warns on an unfolded LayerNorm
        theirs = direct_path_tool()(model, corrupt, cc, kc, metric, sl, sh, component, verbose=False)
    dests = [(dl, dh) for dl in range(sl + 1, L) for dh in range(H)]
    edges = [(f"L{sl}H{sh}", f"L{dl}H{dh}.{component}") for dl, dh in dests]
    ours = ri.path_patching(model, corrupt, metric, reference=clean, edges=edges)
    gaps = []
    for (dl, dh), edge in zip(dests, edges):
        attn = model.blocks[dl].attn
        W, b = getattr(attn, f"W_{component.upper()}")[dh], getattr(attn, f"b_{component.upper()}")[dh]
        exact = _head_input_run(model, corrupt, dl, dh, component, lambda t, box: ln1_by_hand(model, dl, box["x"] + delta) @ W + b)
        linear = _head_input_run(model, corrupt, dl, dh, component, lambda t, box: t + (delta / box["scale"]) @ W)
        assert abs(ours.edge(*edge) - (exact - corrupt_metric)) <= TOL
        assert abs(float(theirs[dl, dh]) - linear) <= TOL
        gaps.append(abs(float(theirs[dl, dh]) - corrupt_metric - ours.edge(*edge)))
    assert max(gaps) > 100 * TOL, gaps  # measured: 0.023 unfolded, 0.027 folded, on effects up to 0.038


@NO_FAITHFULNESS
@pytest.mark.parametrize("k", [0, 12, 40, 100])
def test_single_pair_faithfulness_equals_transformer_lens(hf_model, k):
    model = hf_model
    L = model.cfg.n_layers
    clean, corrupt = (t[:1] for t in pairs(model))
    circuit = ri.top_edges(ri.edge_attribution_patching(model, corrupt, metric, reference=clean), k)
    theirs = tl.faithfulness(model, clean, corrupt, metric,
                             [(node(s, p, reader=False, n_layers=L), node(r, p, reader=True, n_layers=L)) for s, r in circuit for p in range(N_POS)])
    with torch.no_grad():
        m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
    kept = ri.evaluate_circuit(model, clean, metric, circuit, reference=corrupt)  # resample: ablated edges carry corrupt's writes
    recovered = (kept - m_corrupt) / (m_clean - m_corrupt)
    assert theirs.total_edges == ri.edge_layout(model).n_edges * N_POS and theirs.circuit_size == k * N_POS
    assert abs(m_clean - m_corrupt) > 0.05
    diffs = (abs(theirs.full_metric - m_clean), abs(theirs.corrupt_metric - m_corrupt), abs(theirs.recovered - recovered),
             abs(m_corrupt + theirs.recovered * (m_clean - m_corrupt) - kept))
    assert max(diffs) <= TOL, diffs
