"""Issue 60: query and key norms that span the heads (OLMo-2, OLMoE). An edge into head ``h``'s query means
``q_h = slice_h(q_norm((x + d) W_Q))``, every other head's query unchanged (the keys alike, per KV head).

Each helper that moves a receiver is checked here against a brute force written apart from rs_interp: plain
hooks on the model's own modules (the Hugging Face ``q_norm``/``k_norm``/``v_proj`` on 4.x, TransformerLens's on
3.x) that run the model's own shared norm on the moved input and put back head ``h``'s slice alone; the senders'
writes recorded in the same run (a post-norm block's head through its own norm after the attention, changed by
that head alone, as the tolerances page defines it). Tiny perturbed OLMo-2 (multi-head and grouped-query) and
OLMoE checkpoints in float64 (OLMoE's experts run eagerly: the grouped kernel takes no float64); 3.9 cannot load
OLMo-2 with grouped queries (its converter names ``W_K`` where the module has ``_W_K``) nor run OLMoE in float64
(its router is built in float32), so there the grouped OLMo-2 is 3.9's conversion of the multi-head checkpoint
with two of its heads' keys and values kept, and OLMoE is loaded in float32 and cast.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.circuits.selection import circuit_at, prune
from tests.hf_families import COMMON, metric, save_checkpoint

TL4 = _backend.TL_MAJOR >= 4
FAMILIES = {
    "olmo2": lambda T: T.Olmo2Config(**COMMON),
    "olmo2_gqa": lambda T: T.Olmo2Config(**COMMON, num_key_value_heads=2),
    "olmoe": lambda T: T.OlmoeConfig(**COMMON, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2),
}


def _load(family, folder):
    """The checkpoint of ``family`` saved in ``folder`` and loaded in float64 (3.9: see the module docstring)."""
    grouped_on_3x = family == "olmo2_gqa" and not TL4
    save_checkpoint("olmo2" if grouped_on_3x else family, folder, FAMILIES)
    if family == "olmoe":  # transformers' grouped expert kernel refuses float64; the eager loop is the same function
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(cfg | {"experts_implementation": "eager"}))
    if TL4:
        return ri.load_pretrained(folder, dtype=torch.float64)
    if grouped_on_3x:
        return _grouped(ri.load_pretrained(folder, dtype=torch.float64))
    model = ri.load_pretrained(folder, dtype=torch.float32 if family == "olmoe" else torch.float64)
    return model.to(torch.float64)  # 3.9's MoE router is an nn.Linear in float32 whatever the dtype


def _grouped(base, kept=(0, 2)):
    """3.9's own OLMo-2 (converted from the perturbed checkpoint) with grouped queries: two KV heads, the keys,
    values and key-norm gains of the checkpoint's heads ``kept``, every other weight the checkpoint's."""
    cfg = _backend.make_config(**_backend.config_of(base) | {"n_key_value_heads": len(kept), "device": "cpu"})
    model = _backend.build_model(cfg)
    state, d_head = _backend.portable_state(base), cfg.d_head
    grouped = {}
    for name, want in _backend.portable_state(model).items():
        full = state.get(name.replace("._", "."))  # _W_K -> W_K (per head of the checkpoint)
        if name.endswith("k_norm.w"):
            full = state[name].view(-1, d_head)[list(kept)].flatten()
        elif full.shape != want.shape:
            full = full[list(kept)]
        grouped[name] = full
    _backend.load_portable_state(model, grouped)
    return model.eval()


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request, tmp_path_factory):
    return _load(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 299, (2, 7), generator=g), torch.randint(0, 299, (2, 7), generator=g)


def _tol(model):
    """1e-10 in float64, but where the model rounds to float32 inside: OLMoE's router takes its softmax in float32
    (measured gaps ~1e-7 where the MoE's input differs by float64 rounding)."""
    moe = "Olmoe" in (getattr(model.cfg, "original_architecture", None) or type(_hf(model.blocks[0].mlp)).__name__)
    return 1e-6 if moe else 1e-10


def _hf(module):
    return getattr(module, "original_component", None) or module


def _close(got, want, model, what):
    scale = max(1.0, abs(float(want)))
    assert abs(float(got) - float(want)) <= _tol(model) * scale, f"{what}: {float(got)!r} vs {float(want)!r}"


# --- the model's own modules, read apart from rs_interp -----------------------------------------------------

def _post_norm(model):
    """OLMo-2: a norm after each sublayer and none before (its q and k norms span the heads as OLMoE's do)."""
    return _backend.has_post_norms(model)


class Layer:
    """Layer ``l``'s modules as the model runs them: the norm before the attention (None on OLMo-2), the
    projections (Hugging Face's on 4.x, ``W x + b`` by TransformerLens's weights on 3.x), the query and key norms
    (the attention's ``q_norm``/``k_norm``: the bridge's own on 4.x, which computes the norm itself)."""

    def __init__(self, model, l):
        block, self.l, self.H, self.dh = model.blocks[l], l, model.cfg.n_heads, model.cfg.d_head
        attn = self.attn = block.attn
        self.ln1 = None if _post_norm(model) else block.ln1
        self.norm = {"q": attn.q_norm, "k": attn.k_norm}
        if TL4:
            self.proj = {x: attn._modules[x].original_component for x in "qkv"}  # the raw nn.Linear (no bridge hooks)
        else:
            self.proj = {x: self._projection(*self._weights(attn, x)) for x in "qkv"}
        self.post = (block.ln1_post if TL4 else block.ln1) if _post_norm(model) else None
        self.mlp_reader = block.mlp if _post_norm(model) else block.ln2

    @staticmethod
    def _weights(attn, x):
        """3.x's ``W_x``, ``b_x``: one per KV head under grouped-query attention (``_W_K``, ``_b_K``)."""
        X = x.upper()
        W, b = getattr(attn, f"_W_{X}", None), getattr(attn, f"_b_{X}", None)
        return (getattr(attn, f"W_{X}") if W is None else W), (getattr(attn, f"b_{X}") if b is None else b)

    @staticmethod
    def _projection(W, b):
        return lambda u: (torch.einsum("bpm,hmd->bphd", u, W) + b).flatten(-2)

    def read(self, x):
        """What the projections read of the stream ``x``."""
        return x if self.ln1 is None else self.ln1(x)

    def head_input(self, which, x):
        """Every head's (or KV head's) ``which`` from the stream ``x``, its norm applied: (batch, pos, n * d_head)."""
        y = self.proj[which](self.read(x))
        return self.norm[which].forward(y) if which in "qk" else y  # forward: not through the hook replacing it

    def attention_output(self, z):
        """The raw attention output of ``z`` (batch, pos, head, d_head): every head's ``z W_O`` plus the bias."""
        if TL4:
            return self.attn._modules["o"].original_component(z.flatten(-2))
        return torch.einsum("bphd,hdm->bpm", z, self.attn.W_O) + self.attn.b_O

    def head_write(self, z, dz, h):
        """What head ``h`` adds to the stream when its output moves by ``dz`` (batch, pos, d_head), the others kept."""
        moved = z.clone()
        moved[:, :, h] = moved[:, :, h] + dz
        after, before = self.attention_output(moved), self.attention_output(z)
        return after - before if self.post is None else self.post(after) - self.post(before)


def _parse(receiver):
    m = re.fullmatch(r"L(\d+)(H|KV)(\d+)\.([qkv])", receiver)
    return (int(m.group(1)), m.group(4), int(m.group(3))) if m else None


def moved_run(model, toks, moves, *, extra=()):
    """The model run on ``toks`` with each receiver of ``moves`` (label -> ``fn(seen) -> delta`` (batch, pos,
    d_model), ``seen`` this run's stream and senders' activations so far) moved by its delta alone: a head's q or k
    slice of the norm's output replaced by the model's own norm of the moved input's projections, taken at the head;
    a v slice of the projection the moved input's; an MLP's or the final norm's input plus the delta. Returns the
    logits."""
    L = model.cfg.n_layers
    seen, handles = {}, []
    fwd = [("blocks.0.hook_resid_pre", lambda t, hook: seen.__setitem__("embed", t))]
    fwd += [(f"blocks.{l}.hook_resid_pre", lambda t, hook, l=l: seen.__setitem__(("x", l), t)) for l in range(L)]
    fwd += [(f"blocks.{l}.attn.hook_z", lambda t, hook, l=l: seen.__setitem__(("z", l), t)) for l in range(L)]
    fwd += [(f"blocks.{l}.hook_mlp_out", lambda t, hook, l=l: seen.__setitem__(("mlp", l), t)) for l in range(L)]
    by_slot = {}
    for receiver, fn in moves.items():
        at = _parse(receiver)
        if at is None:
            module = Layer(model, int(receiver[3:])).mlp_reader if receiver.startswith("MLP") else model.ln_final
            handles.append(module.register_forward_pre_hook(lambda mod, args, fn=fn: (args[0] + fn(seen), *args[1:])))
        else:
            by_slot.setdefault(at[:2], []).append((at[2], fn))
    for (l, which), slots in by_slot.items():
        layer = Layer(model, l)

        def replace(out, layer=layer, which=which, slots=slots, l=l):
            out = out.clone()
            for s, fn in slots:
                new = layer.head_input(which, seen[("x", l)] + fn(seen))
                out[..., s * layer.dh:(s + 1) * layer.dh] = new[..., s * layer.dh:(s + 1) * layer.dh]
            return out
        if which in "qk":
            handles.append(layer.norm[which].register_forward_hook(lambda mod, args, out, r=replace: r(out)))
        else:
            fwd.append((f"blocks.{l}.attn.hook_v", lambda t, hook, r=replace: r(t.flatten(-2)).view(t.shape)))
    try:
        return model.run_with_hooks(toks, fwd_hooks=[*extra, *fwd])
    finally:
        for handle in handles:
            handle.remove()


def _record(model, toks):
    L = model.cfg.n_layers
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.attn.hook_z" for l in range(L)]
    names += [f"blocks.{l}.hook_mlp_out" for l in range(L)]
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[(n, lambda t, hook, n=n: box.__setitem__(n, t.detach().clone()))
                                              for n in names])
    return {"embed": box[names[0]]} | {("z", l): box[f"blocks.{l}.attn.hook_z"] for l in range(L)} | {
        ("mlp", l): box[f"blocks.{l}.hook_mlp_out"] for l in range(L)}


def sender_change(model, ref, sender, seen):
    """``ablated_s - write_s`` of ``sender`` against this run's activations ``seen`` (the reference's ``ref``)."""
    if sender == "embed":
        return ref["embed"] - seen["embed"]
    if sender.startswith("MLP"):
        l = int(sender[3:])
        return ref[("mlp", l)] - seen[("mlp", l)]
    l, h = map(int, re.fullmatch(r"L(\d+)H(\d+)", sender).groups())
    z = seen[("z", l)]
    return Layer(model, l).head_write(z, ref[("z", l)][:, :, h] - z[:, :, h], h)


def brute_circuit(model, toks, ref, cut):
    """The metric with every edge of ``cut`` ablated (resampled from the reference's activations ``ref``)."""
    moves = {}
    for s, r in cut:
        moves.setdefault(r, []).append(s)
    fns = {r: (lambda seen, ss=ss: sum(sender_change(model, ref, s, seen) for s in ss)) for r, ss in moves.items()}
    with torch.no_grad():
        return float(metric(moved_run(model, toks, fns)))


# --- the receivers under test -------------------------------------------------------------------------------

def _receivers(model):
    """Layer 1's receivers of each kind: two query heads, the first and last key (KV) head, one value."""
    wanted = ("L1H0.q", "L1H3.q", "L1H0.k", "L1H3.k", "L1KV0.k", "L1KV1.k", "L1H1.v", "L1KV1.v")
    return [r for r in ri.edge_layout(model).receivers if r in wanted]


def _senders(model):
    return ["embed", "MLP0"] + ([] if _post_norm(model) else ["L0H1"])


@pytest.fixture(scope="module")
def runs(model, tokens):
    toks, ref = tokens
    with torch.no_grad():
        clean = float(metric(model(toks)))
    return {"clean": clean, "ref": _record(model, ref), "run": _record(model, toks)}


def test_the_per_head_inputs_move_one_heads_query_by_the_definition(model, runs, tokens):
    """The certificate's ``head inputs`` holds (3.9's own split inputs and 4.3's fork leak through the norm without
    rs_interp's copies: see :func:`test_without_the_copies_the_identity_fails_and_helpers_refuse_by_name`)."""
    cert = ri.certify(model)
    assert cert.holds("head inputs", "readers"), cert.table()


def test_path_patching_into_queries_and_keys_is_the_definition(model, runs, tokens):
    toks, ref = tokens
    edges = [(s, r) for s in _senders(model) for r in _receivers(model)]
    pp = ri.path_patching(model, toks, metric, reference=ref, edges=edges, progress=False)
    for s, r in edges:
        _close(pp.edge(s, r), brute_circuit(model, toks, runs["ref"], [(s, r)]) - runs["clean"], model, f"{s} -> {r}")


@pytest.mark.parametrize("ig_steps", [None, 2])
def test_eap_and_eap_ig_into_queries_and_keys_are_the_definitions_derivative(model, runs, tokens, ig_steps):
    """EAP (EAP-IG) of ``s -> r`` is d/de m (mean over the points k/m of the line from the reference's input
    embedding) with ``r``'s input moved by ``e w_s`` alone, ``w_s`` the sender's change on the clean runs."""
    toks, ref = tokens
    got = ri.edge_attribution_patching(model, toks, metric, reference=ref, ig_steps=ig_steps, progress=False)
    alphas = [1.0] if ig_steps is None else [k / ig_steps for k in range(ig_steps)]
    clean, xr = runs["run"], runs["ref"]["embed"]
    for s in _senders(model):
        w = sender_change(model, runs["ref"], s, clean)
        for r in (r for r in _receivers(model) if not r.endswith(".v")):  # (values: no norm across the heads)
            total = 0.0
            for a in alphas:
                e = torch.zeros((), dtype=torch.float64, requires_grad=True)
                line = [("blocks.0.hook_resid_pre", lambda t, hook, a=a: xr + a * (t - xr))]
                m = metric(moved_run(model, toks, {r: lambda seen: e * w}, extra=line))
                total += float(torch.autograd.grad(m, e)[0]) / len(alphas)
            _close(got.edge(s, r), total, model, f"{s} -> {r} (ig_steps={ig_steps})")


def test_evaluate_circuit_cutting_queries_and_keys_is_the_definition(model, runs, tokens):
    """Several edges into the queries and keys of one layer cut together, with edges into the MLPs and logits."""
    toks, ref = tokens
    layout = ri.edge_layout(model)
    cut = [(s, r) for s in _senders(model) + ["L0H2"] for r in _receivers(model)]
    cut += [("MLP0", "logits"), ("L1H2", "logits")]
    keep = [e for e in layout.edges() if e not in cut]
    got = ri.evaluate_circuit(model, toks, metric, keep, reference=ref)
    _close(got, brute_circuit(model, toks, runs["ref"], cut), model, "circuit")


def test_acdc_and_the_faithfulness_curve_are_the_definition(model, runs, tokens):
    """ACDC's final metric and each circuit of the curve, against the brute force of the same circuit."""
    toks, ref = tokens
    layout = ri.edge_layout(model)
    everything = set(layout.edges())
    run = ri.acdc(model, toks, metric, reference=ref, threshold=0.05, progress=False)
    _close(run.final, brute_circuit(model, toks, runs["ref"], sorted(everything - set(run.circuit()))), model, "ACDC")
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref, progress=False)
    fractions = (0.2, 0.5)
    curve = ri.faithfulness_curve(model, toks, metric, eap, reference=ref, fractions=fractions, progress=False)
    for f, value in zip(fractions, curve.values):
        keep = prune(layout, circuit_at(eap, f, pruned=False))
        kept = {(layout.senders[i], layout.receivers[j]) for i, j in keep.nonzero().tolist()}
        _close(value, brute_circuit(model, toks, runs["ref"], sorted(everything - kept)), model, f"curve at {f}")


def _z_gradient(model, toks, l):
    """d metric / d z of layer ``l`` at the run (autograd through a hook on ``hook_z``)."""
    name = f"blocks.{l}.attn.hook_z"
    with torch.no_grad():
        z = model.run_with_cache(toks, names_filter=name)[1][name]
    e = torch.zeros_like(z, dtype=torch.float64, requires_grad=True)
    logits = model.run_with_hooks(toks, fwd_hooks=[(name, lambda t, hook: t + e.to(t.dtype))])
    return torch.autograd.grad(metric(logits), e)[0]


def _relevance_at_z(model, toks, l):
    """RelP's coefficient at layer ``l``'s ``z`` (rs_interp's sweep of LRP's rules, checked against the rules' brute
    force in tests/circuits/test_relevance.py)."""
    from rs_interp.circuits._lrp import recorded_gradient, run_points, sweep

    box, _, g = recorded_gradient(model, toks, metric, run_points(model))
    R = {}

    def keep(layer, kind, t):
        if kind == "z":
            R[layer] = t.to(torch.float64)

    sweep(model, box, g, torch.float64, keep)
    return R[l]


@pytest.mark.parametrize("method", ["EAP", "RelP"])
def test_the_qk_fix_moves_each_receivers_query_or_key_by_the_definition(model, runs, tokens, method):
    """The QK-fixed edge ``s -> r`` is ``sum (z' - z) . dm/dz`` over the heads reading ``r`` (RelP: its coefficient at
    ``z`` in place of ``dm/dz``), ``z'`` layer 1's output with ``r``'s input moved by ``w_s`` alone (the brute
    force's norm of the moved input, taken at the head). RelP's fails without the copies (issue 66 after issue 60)."""
    toks, ref = tokens
    fn = ri.edge_attribution_patching if method == "EAP" else ri.edge_relevance_patching
    if method == "RelP" and not ri.certify(model).holds("mlp weights"):  # OLMoE: RelP's rules need the MLP by hand
        with pytest.raises(ValueError, match="the identity 'mlp weights' fails"):
            fn(model, toks, metric, reference=ref, qk_fix=True, progress=False)
        return
    got = fn(model, toks, metric, reference=ref, qk_fix=True, progress=False)
    dz = _z_gradient(model, toks, 1) if method == "EAP" else _relevance_at_z(model, toks, 1)
    z = runs["run"][("z", 1)].to(torch.float64)
    H, group = model.cfg.n_heads, model.cfg.n_heads // _backend.kv_groups(model.cfg)
    for s in _senders(model):
        w = sender_change(model, runs["ref"], s, runs["run"])
        for r in (r for r in _receivers(model) if not r.endswith(".v")):
            box = {}
            keep = [("blocks.1.attn.hook_z", lambda t, hook: box.__setitem__("z", t))]
            with torch.no_grad():
                moved_run(model, toks, {r: lambda seen: w}, extra=keep)
            _, _, slot = _parse(r)
            heads = [slot] if "KV" not in r else [h for h in range(H) if h // group == slot]
            want = float(((box["z"].to(torch.float64) - z)[:, :, heads] * dz[:, :, heads]).sum())
            _close(got.edge(s, r), want, model, f"QK-fixed {s} -> {r}")


def test_the_hessian_correction_differentiates_the_definition_twice(model, runs, tokens):
    """``correction="hessian"`` (refused on OLMo-2's post-norm blocks): ``w_s . g_r(1) - (1/2) w_s . g_r'(1)``, the
    derivative along ``r``'s moved input and its change along the line from the reference's input embedding."""
    toks, ref = tokens
    if _post_norm(model):
        with pytest.raises(ValueError, match="post-norm"):
            ri.edge_attribution_patching(model, toks, metric, reference=ref, correction="hessian")
        return
    got = ri.edge_attribution_patching(model, toks, metric, reference=ref, correction="hessian", progress=False)
    xr = runs["ref"]["embed"]
    for s in _senders(model):
        w = sender_change(model, runs["ref"], s, runs["run"])
        for r in ("L1H0.q", "L1KV1.k"):
            e = torch.zeros((), dtype=torch.float64, requires_grad=True)
            a = torch.ones((), dtype=torch.float64, requires_grad=True)
            line = [("blocks.0.hook_resid_pre", lambda t, hook: xr + a * (t - xr))]
            m = metric(moved_run(model, toks, {r: lambda seen: e * w}, extra=line))
            (first,) = torch.autograd.grad(m, e, create_graph=True)
            (second,) = torch.autograd.grad(first, a)
            _close(got.edge(s, r), float(first.detach()) - 0.5 * float(second), model, f"Hessian-corrected {s} -> {r}")


def test_without_the_copies_the_identity_fails_and_helpers_refuse_by_name(model, tokens, monkeypatch):
    """TransformerLens's own per-head inputs (3.9's split inputs, 4.3's fork) normalise the concatenation: one head's
    input moves every head's query. Without rs_interp's copies the certificate's ``head inputs`` fails and every
    helper with such receivers refuses, naming it (before issue 60: a wrong number with no error)."""
    import contextlib

    from rs_interp._backend import head_copies

    toks, ref = tokens
    monkeypatch.setattr(head_copies, "per_head_copies", lambda norms, seen: contextlib.nullcontext())
    try:
        cert = ri.certify(model, refresh=True)
        assert "head inputs" in cert.failed() and cert["head inputs"].gap > 1e-3, cert.table()
        edges = [("embed", "L1H0.q")]
        for call in (lambda: ri.path_patching(model, toks, metric, reference=ref, edges=edges, progress=False),
                     lambda: ri.edge_attribution_patching(model, toks, metric, reference=ref, progress=False),
                     lambda: ri.evaluate_circuit(model, toks, metric, [("embed", "logits")], reference=ref),
                     lambda: ri.acdc(model, toks, metric, reference=ref, threshold=0.1, progress=False),
                     *([lambda: ri.edge_relevance_patching(model, toks, metric, reference=ref, qk_fix=True)]
                       if cert.holds("mlp weights") else [])):  # RelP refuses OLMoE's MoE by 'mlp weights' first
            with pytest.raises(ValueError, match="the identity 'head inputs' fails"):
                call()
    finally:
        monkeypatch.undo()
        assert ri.certify(model, refresh=True).holds("head inputs")
