"""Issue 49: one regime. Every public function that takes a model is in the certificate's NEEDS (or on
its exemption list, with a reason), and each one refuses, naming an identity it needs, on a model where
that identity is broken: the walk reads the public API as a user sees it, so a new helper that forgets
to declare what it relies on fails here."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest
import torch

import rs_interp as ri
from rs_interp import features, scale
from rs_interp._messages import LIMIT
from rs_interp.exact.certificate import ADAPTS, CONDITIONS, EXEMPT, IDENTITIES, NEEDS, OPTIONAL, REFUSES
from tests.builders import make_variant
from tests.mutations import MUTATIONS

DEMOTED = {name for names in ri._DEMOTED.values() for name in names}


def _public_functions() -> dict[str, object]:
    """Every public function reachable from ``rs_interp`` (its ``__all__``, its subpackages' and every role package's)
    that takes a ``model`` argument, by the name a user calls it with: a function public in two places
    (``rs_interp.score_model`` is also ``rs_interp.models.score_model``) by the shorter one, a package's
    own names before its subpackages'."""
    out, seen = {}, set()

    def walk(module, prefix: str) -> None:
        names = [(name, getattr(module, name)) for name in getattr(module, "__all__", ())]
        for name, obj in names:
            if (inspect.isfunction(obj) and "model" in inspect.signature(obj).parameters
                    and all(obj is not known for known in out.values())):
                # a name that left the top level (issue 65) keeps its certificate name, NEEDS' key and its refusals'
                # wording, while its old spelling answers
                out[name if name in DEMOTED else prefix + name] = obj
        for name, obj in names:
            if inspect.ismodule(obj) and obj.__name__.startswith("rs_interp") and obj.__name__ not in seen:
                seen.add(obj.__name__)
                walk(obj, f"{prefix}{name}.")

    walk(ri, "")
    # then every role package's own names (a method exported only as rs_interp.circuits.X is public too)
    for info in pkgutil.iter_modules(ri.__path__):
        if info.ispkg and not info.name.startswith("_") and f"rs_interp.{info.name}" not in seen:
            seen.add(f"rs_interp.{info.name}")
            walk(importlib.import_module(f"rs_interp.{info.name}"), f"{info.name}.")
    return out


def test_every_public_function_that_takes_a_model_is_certified_or_exempt():
    public = _public_functions()
    assert len(public) > 40, "the walk sees the API"
    assert sorted(set(public) - set(NEEDS) - set(EXEMPT)) == []


def test_the_lists_name_public_functions_and_known_identities():
    public = _public_functions()
    assert sorted(set(NEEDS) - set(public)) == [] and sorted(set(EXEMPT) - set(public)) == []
    assert not set(NEEDS) & set(EXEMPT)
    assert all(len(why) > 20 for why in EXEMPT.values()), "every exemption says why"
    named = {n for needs in NEEDS.values() for n in needs} | {n for d in (*OPTIONAL.values(), *ADAPTS.values()) for n in d}
    assert named <= set(IDENTITIES)
    assert {c for cs in REFUSES.values() for c in cs} <= set(CONDITIONS) and set(REFUSES) <= set(NEEDS)


def test_the_conditions_name_the_arguments_by_their_current_keywords():
    """OPTIONAL's "when" texts are shown in the certificate's table: none may name a keyword renamed in
    issue 51 (``kind 'q' or 'k'`` sent a user to the deprecated ``kind=``; the keyword is ``which=``)."""
    public = _public_functions()
    stale = {(helper, old) for helper, whens in OPTIONAL.items() for when in whens.values()
             for old in getattr(public[helper], "__renamed__", {}) if re.search(rf"\b{old}\b", when)}
    assert stale == set()


def test_the_table_says_for_every_helper_whether_it_answers():
    model = make_variant("LN", "standard", False)
    MUTATIONS["heads"](model)
    table = ri.certify(model).table()
    rows = {line.split()[0]: line for line in table.splitlines()[table.splitlines().index("") + 2:]}
    assert set(rows) == set(NEEDS)
    assert rows["direct_logit_attribution"].split(maxsplit=1)[1].startswith("no: heads")
    assert rows["logit_lens"].split()[1] == "yes" and rows["features.attribution_graph"].split()[1] == "yes"
    assert "attention-only (configuration)" in ri.certify(make_variant(None, "standard", True)).table()


# --- each helper refuses, naming an identity it needs, where that identity fails ------------------

def _metric(logits):
    return logits[:, -1, 0].mean()


def _task_batch(tokens, reference):
    return [scale.Batch(tokens=tokens, reference=reference, metric=_metric, weight=1, targets=tokens.roll(-1, 1))]


def _pairs(tokens, reference):
    """A pair set of the two batches, interchanged and read at the last position (rs_interp.variables)."""
    from rs_interp.variables import PairSet

    n, last = tokens.shape[0], torch.full((tokens.shape[0],), tokens.shape[1] - 1)
    return PairSet(base=tokens, source=reference, labels=torch.zeros(n, dtype=torch.long),
                   base_labels=torch.ones(n, dtype=torch.long), read=last, candidates=torch.tensor([[1, 2]] * n),
                   base_positions=last, source_positions=last)


#: helper -> (the model it runs on, a call of it). Models: "mlp" (LN, MLPs with ReLU), "attn" (attention-only, no norm),
#: "rotary" (attention-only, rotary). The call gets (model, tokens, reference, clean): clean results of the same shapes.
CALLS = {
    "direct_logit_attribution": ("mlp", lambda m, t, r, c: ri.direct_logit_attribution(m, t, targets=r)),
    "second_order_attribution": ("mlp", lambda m, t, r, c: ri.second_order_attribution(m, t, targets=r, positions=[-1])),
    "path_expansion": ("attn", lambda m, t, r, c: ri.path_expansion(m, t)),
    "path_logit_attribution": ("attn", lambda m, t, r, c: ri.path_logit_attribution(m, t, targets=r)),
    "logit_lens": ("mlp", lambda m, t, r, c: ri.logit_lens(m, t)),
    "lens_kl": ("mlp", lambda m, t, r, c: ri.lens_kl(m, t)),
    "train_tuned_lens": ("mlp", lambda m, t, r, c: ri.train_tuned_lens(m, t, steps=1, progress=False)),
    "fit_jacobian_lens": ("mlp", lambda m, t, r, c: ri.fit_jacobian_lens(m, t, skip_first=1, progress=False)),
    "jacobian_lens": ("mlp", lambda m, t, r, c: ri.jacobian_lens(m, t, c["jlens"])),
    "lens_vectors": ("mlp", lambda m, t, r, c: ri.readouts.lens_vectors(m, c["jlens"], 3, 0)),
    "lens_steering_hooks": ("mlp", lambda m, t, r, c: ri.readouts.lens_steering_hooks(m, c["jlens"], 3, [0])),
    "lens_ablation_hooks": ("mlp", lambda m, t, r, c: ri.readouts.lens_ablation_hooks(m, c["jlens"], 3, [0])),
    "lens_swap_hooks": ("mlp", lambda m, t, r, c: ri.readouts.lens_swap_hooks(m, c["jlens"], 3, 4, [0])),
    "jspace_decomposition": ("mlp", lambda m, t, r, c: ri.readouts.jspace_decomposition(m, c["jlens"], t[0], 0, position=-1)),
    "jspace_occupancy": ("mlp", lambda m, t, r, c: ri.readouts.jspace_occupancy(m, c["jlens"], t[0], 0, position=-1, controls=1)),
    "jspace_variance": ("mlp", lambda m, t, r, c: ri.readouts.jspace_variance(m, c["jlens"], t, progress=False)),
    "coordinate_patch": ("mlp", lambda m, t, r, c: ri.readouts.coordinate_patch(m, c["jlens"], t[0], 0, 3, 4, position=-1)),
    "coordinate_patch_hooks": ("mlp", lambda m, t, r, c: ri.readouts.coordinate_patch_hooks(m, c["jlens"], 3, 4, [0], positions=[-1])),
    "attribution_patching": ("mlp", lambda m, t, r, c: ri.attribution_patching(m, t, _metric, reference=r)),
    "edge_attribution_patching": ("mlp", lambda m, t, r, c: ri.edge_attribution_patching(m, t, _metric, reference=r)),
    "fix_unreliable": ("mlp", lambda m, t, r, c: ri.fix_unreliable(m, t, _metric, c["hessian"], reference=r)),
    "edge_relevance_patching": ("mlp", lambda m, t, r, c: ri.edge_relevance_patching(m, t, _metric, reference=r)),
    "relevance_patching": ("mlp", lambda m, t, r, c: ri.relevance_patching(m, t, _metric, reference=r)),
    "path_patching": ("mlp", lambda m, t, r, c: ri.path_patching(m, t, _metric, reference=r)),
    "evaluate_circuit": ("mlp", lambda m, t, r, c: ri.evaluate_circuit(m, t, _metric, [("embed", "logits")], reference=r)),
    "faithfulness_curve": ("mlp", lambda m, t, r, c: ri.faithfulness_curve(m, t, _metric, c["eap"], reference=r)),
    "mib_scores": ("mlp", lambda m, t, r, c: ri.mib_scores(m, t, _metric, c["eap"], reference=r)),
    "acdc": ("mlp", lambda m, t, r, c: ri.acdc(m, t, _metric, reference=r, threshold=0.1, progress=False)),
    "head_ablation_scan": ("mlp", lambda m, t, r, c: ri.head_ablation_scan(m, t, _metric, progress=False)),
    "ablate_heads": ("mlp", lambda m, t, r, c: ri.ablate_heads(m, t, [(0, 0)])),
    "run_with_key_input": ("mlp", lambda m, t, r, c: ri.run_with_key_input(m, t, layer=1)),
    "run_with_query_input": ("mlp", lambda m, t, r, c: ri.run_with_query_input(m, t, layer=1)),
    "composition_scores": ("mlp", lambda m, t, r, c: ri.composition_scores(m, "k")),
    "virtual_weight": ("mlp", lambda m, t, r, c: ri.virtual_weight(m, (0, 0), (1, 0), "k")),
    "copying_scores": ("mlp", lambda m, t, r, c: ri.copying_scores(m)),
    "attention_patterns": ("mlp", lambda m, t, r, c: ri.attention_patterns(m, t)),
    "prev_token_scores": ("mlp", lambda m, t, r, c: ri.prev_token_scores(m, t)),
    "find_prev_token_head": ("mlp", lambda m, t, r, c: ri.find_prev_token_head(m, t)),
    "induction_scores": ("mlp", lambda m, t, r, c: ri.induction_scores(m, t, periods=torch.tensor([3, 3]))),
    "first_token_attention": ("mlp", lambda m, t, r, c: ri.first_token_attention(m, t, min_query=1)),
    "positional_scores": ("rotary", lambda m, t, r, c: ri.positional_scores(m, 0)),
    "key_score_sensitivity": ("mlp", lambda m, t, r, c: ri.key_score_sensitivity(m, t)),
    "features.attribution_graph": ("mlp", lambda m, t, r, c: features.attribution_graph(m, c["tcs"], t[0])),
    "features.intervene": ("mlp", lambda m, t, r, c: features.intervene(m, c["tcs"], c["graph"], [0], scale=0.0)),
    "features.qk_attributions": ("mlp", lambda m, t, r, c: features.qk_attributions(m, c["tcs"], c["graph"], [(1, 0, 3, 1)])),
    "features.top_attention": ("mlp", lambda m, t, r, c: features.top_attention(m, c["tcs"], c["graph"])),
    "features.train_clt": ("mlp", lambda m, t, r, c: features.train_clt(m, t, d_transcoder=4, k=2, steps=1)),
    "features.train_transcoder": ("mlp", lambda m, t, r, c: features.train_transcoder(m, t, d_transcoder=4, steps=1)),
    "features.transcoder_metrics": ("mlp", lambda m, t, r, c: features.transcoder_metrics(m, c["tcs"], t)),
    "features.mlp_transcoders": ("mlp", lambda m, t, r, c: features.mlp_transcoders(m)),
    "scale.attribution_patching": ("mlp", lambda m, t, r, c: scale.attribution_patching(m, _task_batch(t, r), progress=False)),
    "scale.edge_attribution_patching": ("mlp", lambda m, t, r, c: scale.edge_attribution_patching(m, _task_batch(t, r), progress=False)),
    "scale.edge_relevance_patching": ("mlp", lambda m, t, r, c: scale.edge_relevance_patching(m, _task_batch(t, r), progress=False)),
    "scale.path_patching": ("mlp", lambda m, t, r, c: scale.path_patching(m, _task_batch(t, r), progress=False)),
    "scale.evaluate_circuit": ("mlp", lambda m, t, r, c: scale.evaluate_circuit(m, _task_batch(t, r), [("embed", "logits")],
                                                                                    progress=False)),
    "scale.faithfulness_curve": ("mlp", lambda m, t, r, c: scale.faithfulness_curve(m, _task_batch(t, r), c["eap"], progress=False)),
    "scale.mib_scores": ("mlp", lambda m, t, r, c: scale.mib_scores(m, _task_batch(t, r), c["eap"], progress=False)),
    "scale.head_ablation_scan": ("mlp", lambda m, t, r, c: scale.head_ablation_scan(m, _task_batch(t, r), progress=False)),
    "scale.direct_logit_attribution": ("mlp", lambda m, t, r, c: scale.direct_logit_attribution(m, _task_batch(t, r), progress=False)),
    "scale.logit_lens": ("mlp", lambda m, t, r, c: scale.logit_lens(m, _task_batch(t, r), progress=False)),
    "scale.lens_kl": ("mlp", lambda m, t, r, c: scale.lens_kl(m, _task_batch(t, r), progress=False)),
    "variables.interchange": ("mlp", lambda m, t, r, c: ri.variables.interchange(
        m, _pairs(t, r), "blocks.1.hook_resid_pre", torch.eye(m.cfg.d_model, dtype=m.cfg.dtype)[:, :2], progress=False)),
    "variables.das": ("mlp", lambda m, t, r, c: ri.variables.das(
        m, _pairs(t, r), "blocks.1.hook_resid_pre", ri.variables.DASOptions(rank=2, epochs=1), test=_pairs(t, r),
        controls=(), progress=False)),
    "variables.activations": ("mlp", lambda m, t, r, c: ri.variables.activations(m, t, "blocks.1.hook_resid_pre")),
    "head_affinity": ("mlp", lambda m, t, r, c: ri.head_affinity(m, "v")),
    "head_affinities": ("mlp", lambda m, t, r, c: ri.head_affinities(m)),
}

_BASES = {
    "mlp": lambda: make_variant("LN", "standard", False, act_fn="relu"),
    "attn": lambda: make_variant(None, "standard", True),
    "rotary": lambda: make_variant(None, "rotary", True),
}


def test_every_helper_has_a_call():
    assert set(CALLS) == set(NEEDS)


def _broken(helper: str) -> str:
    """The identity the test breaks for ``helper``: the last it needs that a mutation breaks alone."""
    return next(n for n in reversed(NEEDS[helper]) if n in MUTATIONS)


@pytest.fixture(scope="module")
def clean():
    """Results of a clean model that some calls take (scores, transcoders, a graph)."""
    model = _BASES["mlp"]()
    t, r = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0)), torch.randint(0, 50, (2, 6))
    tcs = features.mlp_transcoders(model)
    return {"eap": ri.edge_attribution_patching(model, t, _metric, reference=r),
            "hessian": ri.edge_attribution_patching(model, t, _metric, reference=r, correction="hessian", per_example=True),
            "tcs": tcs, "graph": features.attribution_graph(model, tcs, t[0]),
            "jlens": ri.fit_jacobian_lens(model, t, skip_first=1, progress=False)}


@pytest.mark.parametrize("helper", sorted(NEEDS))
def test_each_helper_refuses_naming_a_broken_identity_it_needs(helper, clean):
    base, call = CALLS[helper]
    identity = _broken(helper)
    model = _BASES[base]()
    MUTATIONS[identity](model)
    assert identity in ri.certify(model).failed()
    t, r = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0)), torch.randint(0, 50, (2, 6))
    with pytest.raises(ValueError, match=rf"{helper} refuses this model: the identity '[a-z ]+' fails") as refused:
        call(model, t, r, clean)
    # named first, or among the failures its mutation also causes (3.x: a backward hook fails readers too)
    assert re.search(rf"the identity '{identity}' fails|\(([a-z ]+, )*{identity}(, [a-z ]+)* fail too\)", str(refused.value))
    assert len(str(refused.value)) <= LIMIT, f"{len(str(refused.value))}: {refused.value}"  # issue 61 item 4: sized for its reader
