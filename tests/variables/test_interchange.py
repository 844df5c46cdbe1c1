"""Interchange interventions against a brute force written here (plain hooks on the raw forward: the source's
activation recorded, the base's set to h + s (h_s - h) B B^T), on every variant of the grid and every kind of
site, one position per pair or every position; the placebo's displacement; the accuracy and effect read
off; refusals; the tracr ground truth (every RASP variable, at the layer tracr writes it, on tracr's own
dimensions: accuracy 1.0; a layer before: no effect at all, the null accuracy); and, under TransformerLens
4.3, its own ``intervened_logits`` on the same model, hook, pairs and basis."""

from __future__ import annotations

import importlib

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.circuits.tracr import TRACR_PROGRAMS
from rs_interp.variables import (
    Interchange,
    NormMatchedPlacebo,
    PairSet,
    Site,
    SubspaceInterchange,
    activations,
    interchange,
    random_basis,
    tracr_pairs,
    tracr_variables,
)
from tests.builders import VARIANTS, architecture_params, make_variant, variant_id
from tests.mutations import MUTATIONS

TL4 = _backend.TL_MAJOR >= 4


def lm_pairs(model, n: int = 5, pos: int = 7, seed: int = 0, every: bool = False) -> PairSet:
    """Random base/source token pairs, read at the last position among 3 candidate tokens."""
    g = torch.Generator().manual_seed(seed)
    base, source = (torch.randint(0, model.cfg.d_vocab, (n, pos), generator=g) for _ in range(2))
    at = None if every else torch.randint(0, pos, (n,), generator=g)
    return PairSet(base=base, source=source, labels=torch.randint(0, 3, (n,), generator=g),
                   base_labels=torch.randint(0, 3, (n,), generator=g), read=torch.full((n,), pos - 1),
                   candidates=torch.randint(0, model.cfg.d_vocab, (n, 3), generator=g), base_positions=at,
                   source_positions=None if every else torch.randint(0, pos, (n,), generator=g))


def brute_force(model, pairs: PairSet, site: Site, basis: torch.Tensor, strength: float = 1.0) -> torch.Tensor:
    """The intervened class scores, by plain hooks on the raw forward, one pair at a time; a change of the
    stream at hook_resid_mid (TransformerLens 4.3: the MLP's input only) is carried on by running the rest of
    the model from the next block on the stream resid_mid' + mlp_out'."""
    out = []
    for i in range(len(pairs)):
        base, source = pairs.base[i:i + 1], pairs.source[i:i + 1]
        box = {}
        model.run_with_hooks(source, fwd_hooks=[(site.hook, lambda t, hook: box.__setitem__("s", t.detach().clone()))])

        def view(t):
            return t[:, :, site.head] if site.head is not None else (t.flatten(2) if site.kind == "z" else t)

        def patch(t, hook):
            t = t.clone()
            h, hs = view(t), view(box["s"])
            B = basis.to(t.dtype)
            if pairs.base_positions is None:
                new = h + strength * ((hs - h) @ B) @ B.T
            else:
                p, q = int(pairs.base_positions[i]), int(pairs.source_positions[i])
                new = h.clone()
                new[:, p] = h[:, p] + strength * ((hs[:, q] - h[:, p]) @ B) @ B.T
            if site.head is not None:
                t[:, :, site.head] = new
            else:
                t = new.reshape(t.shape)
            box["mid"] = t
            return t

        if site.hook.endswith("hook_resid_mid"):
            layer = site.layer
            mlp_out = f"blocks.{layer}.hook_mlp_out"
            model.run_with_hooks(base, fwd_hooks=[(site.hook, patch), (mlp_out, lambda t, hook: box.__setitem__("mlp", t))])
            logits = _backend.run_from(model, box["mid"] + box["mlp"], start=layer + 1) if layer + 1 < model.cfg.n_layers \
                else model.unembed(model.ln_final(box["mid"] + box["mlp"]))
        else:
            logits = model.run_with_hooks(base, fwd_hooks=[(site.hook, patch)])
        out.append(pairs.task_logits(logits.detach(), torch.tensor([i])))
    return torch.cat(out)


def _sites(model) -> list[Site]:
    sites = [Site("blocks.1.hook_resid_pre"), Site("blocks.0.hook_resid_post"), Site("blocks.1.attn.hook_z", 1),
             Site("blocks.0.attn.hook_z")]
    if not model.cfg.attn_only:
        sites.append(Site("blocks.0.mlp.hook_post"))
    if "blocks.1.hook_resid_mid" in model.hook_dict:  # not on parallel blocks (no stream between the sublayers)
        sites.append(Site("blocks.1.hook_resid_mid"))
    return sites


#: The default suite's two variants; the slow one runs the grid (every other variant) and the architectures.
FAST = [("LN", "standard", False), ("RMS", "rotary", False, "gqa")]
GRID = [pytest.param(v, marks=pytest.mark.slow, id=variant_id(v)) for v in VARIANTS[::2] if v not in FAST] + [
    pytest.param(p.values[0], marks=[*p.marks, pytest.mark.slow], id=p.id) for p in architecture_params()
    if p.values[0] not in FAST]


@pytest.mark.parametrize("variant", [pytest.param(v, id=variant_id(v)) for v in FAST] + GRID)
def test_interchange_is_the_brute_force(variant):
    model = make_variant(*variant, n_layers=2)
    for every in (False, True):
        pairs = lm_pairs(model, n=3, every=every)
        for k, site in enumerate(_sites(model)):
            width = site.width(model)
            basis = random_basis(width, min(3, width), seed=k, dtype=torch.float64)
            got = interchange(model, pairs, site, SubspaceInterchange(basis, 0.7), progress=False, batch_size=2)
            want = brute_force(model, pairs, site, basis, 0.7)
            assert float((got.logits - want).abs().max()) <= 1e-9 * max(1.0, float(want.abs().max())), (site, every)


def test_a_full_basis_at_every_position_of_the_stream_is_the_source_run():
    model = make_variant("LN", "standard", False)
    pairs = lm_pairs(model, every=True)
    got = interchange(model, pairs, "blocks.0.hook_resid_pre", torch.eye(model.cfg.d_model, dtype=torch.float64),
                      progress=False)
    want = pairs.task_logits(model(pairs.source))
    assert float((got.logits - want.detach()).abs().max()) < 1e-10


def test_the_placebo_moves_as_far_inside_its_own_subspace():
    model = make_variant(None, "standard", False)
    pairs, d = lm_pairs(model), model.cfg.d_model
    ref, other = random_basis(d, 2, seed=1, dtype=torch.float64), random_basis(d, 2, seed=2, dtype=torch.float64)
    placebo = NormMatchedPlacebo(SubspaceInterchange(ref), other)
    g = torch.Generator().manual_seed(0)
    h, hs = torch.randn(6, d, generator=g, dtype=torch.float64), torch.randn(6, d, generator=g, dtype=torch.float64)
    moved, wanted = placebo(h, hs) - h, SubspaceInterchange(ref)(h, hs) - h
    assert torch.allclose(moved.norm(dim=-1), wanted.norm(dim=-1)) and torch.allclose(moved @ other @ other.T, moved)
    assert interchange(model, pairs, "blocks.1.hook_resid_pre", placebo, progress=False).logits.shape == (5, 3)


def test_accuracy_null_and_effect_are_read_off():
    r = Interchange(logits=torch.tensor([[0.0, 2.0], [3.0, 1.0]]), base_logits=torch.tensor([[1.0, 0.0], [3.0, 0.0]]),
                    labels=torch.tensor([1, 0]), base_labels=torch.tensor([0, 1]), site=Site("blocks.0.hook_resid_pre"))
    assert (r.accuracy, r.null_accuracy, r.base_accuracy) == (1.0, 0.5, 0.5)
    assert r.effect.tolist() == [3.0, -1.0] and r.mean_effect() == 1.0
    same = Interchange(r.logits, r.base_logits, r.labels, r.labels, r.site)
    with pytest.raises(ValueError, match="differs"):
        same.mean_effect()


@pytest.mark.parametrize("site, basis, words", [
    ("blocks.0.hook_resid_pre", torch.eye(16)[:, :2] * 2, "not orthonormal"),
    ("blocks.0.hook_resid_pre", torch.eye(8)[:, :2], "8 rows but the activation it acts on has 16"),
    ("blocks.0.hook_resid_pre", torch.eye(16, 17), "rank 17"),
    ("blocks.5.hook_resid_pre", torch.eye(16)[:, :2], "no hook point"),
    ("blocks.0.hook_resid_mid", torch.eye(16)[:, :2], "no hook point"),  # attention-only
    ("blocks.0.attn.hook_q", torch.eye(16)[:, :2], "not a hook point an interchange acts on"),
    (("blocks.0.attn.hook_z", 9), torch.eye(8)[:, :2], "head 9 is out of range"),
])
def test_bad_input_is_refused_saying_what_is_wrong(site, basis, words):
    model = make_variant(None, "standard", True)
    with pytest.raises(ValueError, match=words):
        interchange(model, lm_pairs(model), site, basis, progress=False)


def test_pairs_the_model_cannot_run_are_refused():
    model = make_variant(None, "standard", True)
    pairs = lm_pairs(model)
    bad = PairSet(base=pairs.base + model.cfg.d_vocab, source=pairs.source, labels=pairs.labels,
                  base_labels=pairs.base_labels, read=pairs.read, candidates=pairs.candidates,
                  base_positions=pairs.base_positions, source_positions=pairs.source_positions)
    with pytest.raises(ValueError, match="vocabulary"):
        interchange(model, bad, "blocks.0.hook_resid_pre", torch.eye(16)[:, :1], progress=False)


def test_a_site_whose_identity_fails_is_refused_by_name():
    model = make_variant(None, "standard", True)
    MUTATIONS["z"](model)  # layer 0's hook_z taken off the forward path
    pairs = lm_pairs(model)
    with pytest.raises(ValueError, match="variables.interchange refuses this model: the identity 'z' fails"):
        interchange(model, pairs, ("blocks.0.attn.hook_z", 0), torch.eye(8)[:, :1], progress=False)
    assert interchange(model, pairs, "blocks.1.hook_resid_pre", torch.eye(16)[:, :1], progress=False).logits.shape == (5, 3)


def test_activations_are_the_sites_view():
    model = make_variant("LN", "rotary", False)
    toks = lm_pairs(model).base
    box = {}
    model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", lambda t, hook: box.__setitem__("z", t.clone()))])
    got = activations(model, toks, ("blocks.1.attn.hook_z", 1), at=torch.tensor([0, 1, 2, 3, 4]), batch_size=2)
    assert torch.equal(got, box["z"][torch.arange(5), torch.arange(5), 1].detach())


# --- the tracr ground truth ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TRACR_PROGRAMS)
def test_tracr_variables_at_tracrs_own_dimensions(name):
    """Every RASP variable some later component reads: interchange accuracy 1.0 on tracr's dimensions at the
    stream after the component that writes it; at the stream before that component, no effect (the logits are
    the base's: the null accuracy, which is below 1)."""
    model = ri.load_toy_model(name)
    for var in tracr_variables(name).values():
        if not var.rank:
            continue
        every = var.name == "target_pos_3"  # one position at a time, sort's target positions clash (no defined output)
        pairs = tracr_pairs(name, var.name, n=10, seed=1, lengths=None if var.name == "length_5" else [4],
                            every_position=every)
        basis = var.basis(model.cfg.d_model)
        at = interchange(model, pairs, var.site, basis, progress=False)
        assert at.accuracy == 1.0 and at.null_accuracy < 1.0, (var.name, at.accuracy, at.null_accuracy)
        if var.before is not None:
            before = interchange(model, pairs, var.before, basis, progress=False)
            assert torch.allclose(before.logits, before.base_logits, atol=1e-6), var.name
            assert before.accuracy == before.null_accuracy == at.null_accuracy


@pytest.mark.skipif(not TL4, reason="TransformerLens 4.3's tools.analysis.interchange (not in 3.x)")
@pytest.mark.parametrize("case", ["tracr", "variant"])
def test_side_by_side_with_transformerlens(case):
    """The same model, hook, pairs and basis (and the placebo): TransformerLens's intervened logits and ours are
    the same floats (measured: bit for bit)."""
    tl = importlib.import_module("transformer_lens.tools.analysis.interchange")
    if case == "tracr":
        model, var = ri.load_toy_model("tracr-hist"), tracr_variables("tracr-hist")["hist_1"]
        pairs = tracr_pairs("tracr-hist", "hist_1", n=30, seed=0, lengths=[5])
        pairs, hook = pairs.subset((pairs.read == 3).nonzero().flatten()), var.site.hook
        task = lambda t: model(t)[:, 3, :]  # noqa: E731  (every candidate, read at position 3)
    else:
        model = make_variant("LN", "rotary", False, dtype=torch.float32)
        pairs, hook = lm_pairs(model, n=6), "blocks.1.hook_resid_pre"
        pairs = PairSet(base=pairs.base, source=pairs.source, labels=pairs.labels, base_labels=pairs.base_labels,
                        read=pairs.read, candidates=pairs.candidates[:1].expand(6, 3), base_positions=pairs.base_positions,
                        source_positions=pairs.source_positions)
        task = lambda t: model(t)[:, -1, pairs.candidates[0]]  # noqa: E731
    d = model.cfg.d_model
    basis, other = random_basis(d, 3, seed=3), random_basis(d, 3, seed=4)
    src = tl.collect_activations(model, hook, pairs.source, task, positions=pairs.source_positions)
    for theirs_fn, mine_fn in [(tl.SubspaceInterchange(basis, 0.8), SubspaceInterchange(basis, 0.8)),
                               (tl.NormMatchedPlacebo(tl.SubspaceInterchange(basis), other),
                                NormMatchedPlacebo(SubspaceInterchange(basis), other))]:
        theirs = tl.intervened_logits(model, hook, theirs_fn, pairs.base, src, task, positions=pairs.base_positions)
        mine = interchange(model, pairs, hook, mine_fn, progress=False).logits
        assert float((theirs - mine).abs().max()) <= 1e-6 * max(1.0, float(theirs.abs().max()))
