"""Issue 40: exact or refused on every family, by construction. Tiny perturbed checkpoints of the
Hugging Face families beyond the first five (tests/hf_families.py), loaded as a user would
(``load_pretrained``), under the installed TransformerLens: the load is the checkpoint's function or
a ValueError naming the family and what to try; then every core helper gives the number a brute
force written here computes (plain hooks on the raw forward, autograd, PyTorch module hooks), within
the tolerance of the model's dtype and source, or a ValueError naming the identity that fails on the
model, and it refuses only then (:func:`rs_interp.certify`). Never a raw error, never a wrong number.

Post-norm blocks (Gemma-2/3, OLMo-2, issue 52): path patching's brute force patches a head through the
norm after the attention, written out here (:func:`post_attention_norm`); the other brute forces read what
the model does (node derivatives by autograd, the logits) and hold unchanged (tests/exact/test_postnorm.py checks
each post-norm definition on its own).

The table of outcomes (family x helper) is written to ``$RS_INTERP_FAMILY_TABLE`` when set.
"""

from __future__ import annotations

import os

import pytest
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp.exact.certificate import NEEDS, TOLERANCES
from tests.features.test_graph import node_write
from tests.hf_families import metric, save_checkpoint, token_pair

#: The families beyond the first five (tests/integration/test_pretrained.py), and Mixtral in float32 too
#: (transformers runs its experts in float32 and half precision only).
CASES = [(f, torch.float64) for f in ("bloom", "phi", "gemma", "gemma2", "gemma3", "olmo", "olmo2", "stablelm", "mistral",
                                      "mixtral", "qwen2", "qwen2_window", "opt", "gpt_neo", "phi3", "llama_bias", "falcon", "cohere",
                                      "gpt_bigcode")] + [("mixtral", torch.float32)]


@pytest.fixture(scope="module")
def tokens():
    return token_pair()


@pytest.fixture(scope="module")
def table():
    rows: dict[tuple[str, str], dict[str, str]] = {}
    yield rows
    path = os.environ.get("RS_INTERP_FAMILY_TABLE")
    if path:
        helpers = list(HELPERS)
        lines = ["| family | load | " + " | ".join(helpers) + " |", "|---" * (len(helpers) + 2) + "|"]
        for (family, dtype), row in sorted(rows.items()):
            lines.append(f"| {family} ({dtype}) | {row.get('load', '')} | " + " | ".join(row.get(h, "") for h in helpers) + " |")
        with open(path, "a") as f:
            f.write(f"\nTransformerLens {_backend.TL_VERSION}\n\n" + "\n".join(lines) + "\n")


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{str(c[1]).split('.')[1]}")
def loaded(request, tmp_path_factory, table):
    family, dtype = request.param
    folder = tmp_path_factory.mktemp(family)
    save_checkpoint(family, folder)
    key = (family, str(dtype).split(".")[1])
    table[key] = {}
    try:
        model = ri.load_pretrained(folder, dtype=dtype)
    except ValueError as err:
        table[key]["load"] = "refused"
        return family, None, err, table[key]
    table[key]["load"] = f"ok ({ri.certify(model)['source'].gap:.0e})"
    return family, model, None, table[key]


def _tol(model) -> float:
    """Absolute tolerance of a result of size about 1: ten times the identities' (:data:`rs_interp.exact.certificate.TOLERANCES`)."""
    return 10 * TOLERANCES[(model.cfg.dtype, _backend.model_source(model))]


def _close(got: float, want: float, model, what: str) -> None:
    assert abs(got - want) <= _tol(model) * max(1.0, abs(want)), f"{what}: {got} vs {want}"


def _record(model, toks, names):
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[(n, lambda t, hook, n=n: box.__setitem__(n, t.clone())) for n in names])
    return box


def test_load_is_the_checkpoint_or_refused_by_name(loaded):
    """A load is refused with a ValueError that names the family and what to try, or its log-probabilities
    are the checkpoint's (the source identity, measured at load)."""
    family, model, err, _ = loaded
    if model is None:
        arch = {"llama_bias": "Llama", "gpt_neo": "GPTNeo", "gpt_bigcode": "GPTBigCode", "qwen2_window": "Qwen2"}.get(
            family, family.replace("_", ""))
        assert arch.lower() in str(err).lower() and ("try" in str(err) or "transformers' own" in str(err)), str(err)
        return
    source = ri.certify(model)["source"]
    assert source.holds and source.gap <= source.tolerance


# --- the helpers, each against a brute force written here ------------------------------------------

def dla(model, toks, ref):
    targets = ri.next_token_targets(toks)
    out = ri.direct_logit_attribution(model, toks, targets=targets)
    with torch.no_grad():
        logits = model(toks).to(torch.float64)
    want = (logits - logits.mean(-1, keepdim=True)).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    gap = float((out.contributions.sum(0) - want)[targets >= 0].abs().max())
    assert gap <= _tol(model) * max(1.0, float(want.abs().max())), gap


def _head_derivatives(model, toks, ref):
    """d metric / d e for every head, e moving its z towards the reference run's (autograd, one pass)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    z_ref = _record(model, ref, [f"blocks.{l}.attn.hook_z" for l in range(L)])
    e = torch.zeros(L, H, dtype=model.cfg.dtype, requires_grad=True)

    def move(l):
        def fn(t, hook):
            return t + e[l][None, None, :, None] * (z_ref[f"blocks.{l}.attn.hook_z"] - t.detach())
        return fn

    (grad,) = torch.autograd.grad(metric(model.run_with_hooks(toks, fwd_hooks=[(f"blocks.{l}.attn.hook_z", move(l)) for l in range(L)])), e)
    return grad.to(torch.float64)


def node(model, toks, ref):
    atp = ri.attribution_patching(model, toks, metric, reference=ref)
    want = _head_derivatives(model, toks, ref)
    for l, h in [(0, 1), (1, 2)]:
        _close(float(atp.effect[l, h]), float(want[l, h]), model, f"head ({l}, {h})")


def edges(model, toks, ref):
    """Each head's outgoing edges sum to its node derivative, each MLP's to the derivative along its
    write added where it enters the stream (resid_post), the embedding's to the derivative at block 0."""
    eap = ri.edge_attribution_patching(model, toks, metric, reference=ref)
    totals = dict(zip(eap.layout.senders, eap.sender_totals().tolist()))
    heads = _head_derivatives(model, toks, ref)
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            _close(totals[f"L{l}H{h}"], float(heads[l, h]), model, f"L{l}H{h}")
    if not model.cfg.attn_only:
        names = [f"blocks.{l}.hook_mlp_out" for l in range(model.cfg.n_layers)]
        run, refd = _record(model, toks, names), _record(model, ref, names)
        e = torch.zeros(model.cfg.n_layers, dtype=model.cfg.dtype, requires_grad=True)
        hooks = [(f"blocks.{l}.hook_resid_post", lambda t, hook, l=l: t + e[l] * (refd[names[l]] - run[names[l]]))
                 for l in range(model.cfg.n_layers)]
        (grad,) = torch.autograd.grad(metric(model.run_with_hooks(toks, fwd_hooks=hooks)), e)
        for l in range(model.cfg.n_layers):
            _close(totals[f"MLP{l}"], float(grad[l]), model, f"MLP{l}")


def scan(model, toks, ref):
    out = ri.head_ablation_scan(model, toks, metric, ablation="zero")

    def zero(t, hook):
        t = t.clone()
        t[:, :, 2] = 0
        return t

    with torch.no_grad():
        want = float(metric(model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", zero)])))
    _close(float(out.ablated[1, 2]), want, model, "head (1, 2) zeroed")


def lens(model, toks, ref):
    targets = ri.next_token_targets(toks)
    out = ri.logit_lens(model, toks, targets=targets)
    with torch.no_grad():
        probs = model(toks).to(torch.float64).softmax(-1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    gap = float((out.target_probs[-1].to(torch.float64) - probs)[targets >= 0].abs().max())
    assert gap <= _tol(model), gap


def _module_patch(module, delta):
    """A PyTorch forward pre-hook adding ``delta`` to ``module``'s input: a patch apart from TransformerLens's hooks.
    (OPT's decoder layer hands its MLP-side norm the positions flattened, (batch * pos, d_model).)"""
    return module.register_forward_pre_hook(lambda mod, args: (args[0] + delta.to(args[0].dtype).reshape(args[0].shape), *args[1:]))


def _shared_norm_patch(block, delta):
    """PyTorch hooks giving a parallel block's MLP, whose input is its one norm's output (no norm of its
    own), the norm of the stream plus ``delta``: the stream recorded at the norm's input, the norm the
    bridge's own module called again. The attention still reads the clean stream's norm."""
    seen = {}

    def record(mod, args):
        seen.setdefault("x", args[0])

    def patch(mod, args):
        return (block.ln1(seen["x"] + delta.to(seen["x"].dtype)), *args[1:])

    handles = [block.ln1.register_forward_pre_hook(record), block.mlp.register_forward_pre_hook(patch)]

    class Handles:
        def remove(self):
            for h in handles:
                h.remove()

    return Handles()


def post_attention_norm(model, layer):
    """Layer ``layer``'s norm after the attention written out from the checkpoint (post-norm blocks: Gemma-2/3,
    OLMo-2): RMSNorm ``x / sqrt(mean(x^2) + eps)`` times the gain, Gemma's ``1 + w`` (its stored offset) and
    OLMo-2's ``w``, ``w`` and ``eps`` read off the Hugging Face module (3.x: its own module's ``w``, the config's
    ``eps``); None where the block has none."""
    olmo2_3x = getattr(model.cfg, "original_architecture", None) == "Olmo2ForCausalLM" and _backend.TL_MAJOR == 3
    post = model.blocks[layer]._modules.get("ln1" if olmo2_3x else "ln1_post")  # 3.9's OLMo-2: after the sublayers at ln1
    if post is None:
        return None
    hf = getattr(post, "original_component", None)
    if hf is None:  # 3.x's own RMSNorm (its conversion adds Gemma's offset to w)
        gain, eps = post.w.detach().to(torch.float64), model.cfg.eps
    else:
        w = hf.weight.detach().to(torch.float64)
        gain = 1 + w if type(hf).__name__.startswith("Gemma") else w
        eps = float(getattr(hf, "eps", getattr(hf, "variance_epsilon", None)))
    return lambda x: gain * x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def path(model, toks, ref):
    """Two edges from L0H1, patched by hand: into the logits (the final norm's input gets the write's change)
    and into MLP1: its norm's input where the model has a norm of the MLP's own; in a parallel block with
    one norm for both sublayers, the MLP's input is that norm of the stream plus the change
    (:func:`_shared_norm_patch`). On a post-norm block the write's change is that of what the attention
    adds to the stream when only L0H1's output is the reference's: ``P(r + d W_O) - P(r)``,
    ``r = z W_O + b_O`` the attention's output before its norm ``P``."""
    blocks = model.blocks[1]
    own_norm = ("ln2" in blocks._modules and blocks.ln2 is not blocks._modules.get("ln1") and model.cfg.normalization_type
                and getattr(model.cfg, "original_architecture", None) != "Olmo2ForCausalLM")  # (3.9's OLMo-2: ln2 is after the MLP)
    shared = ("ln2" not in blocks._modules and "ln1" in blocks._modules and bool(model.cfg.normalization_type)
              and bool(getattr(model.cfg, "parallel_attn_mlp", False)))
    wanted = [("L0H1", "logits")] + ([("L0H1", "MLP1")] if (own_norm or shared) and not model.cfg.attn_only else [])
    pp = ri.path_patching(model, toks, metric, reference=ref, edges=wanted)
    z = "blocks.0.attn.hook_z"
    z_run, attn = _record(model, toks, [z])[z], model.blocks[0].attn
    delta = ((_record(model, ref, [z])[z] - z_run)[:, :, 1] @ attn.W_O[1]).detach()
    post = post_attention_norm(model, 0)
    if post is not None:
        b_O = 0.0 if getattr(attn, "b_O", None) is None else attn.b_O.detach()
        raw = (torch.einsum("bphd,hdm->bpm", z_run, attn.W_O.detach()) + b_O).to(torch.float64)
        delta = post(raw + delta) - post(raw)
    with torch.no_grad():
        clean = float(metric(model(toks)))
    for edge in wanted:
        if edge[1] == "logits" or own_norm:
            handle = _module_patch(model.ln_final if edge[1] == "logits" else blocks.ln2, delta)
        else:
            handle = _shared_norm_patch(blocks, delta)
        try:
            with torch.no_grad():
                want = float(metric(model(toks))) - clean
        finally:
            handle.remove()
        _close(pp.edge(*edge), want, model, str(edge))


def circuit(model, toks, ref):
    """The circuit of every edge is the clean run; the empty circuit, resampled, is the reference run."""
    with torch.no_grad():
        clean, reference = float(metric(model(toks))), float(metric(model(ref)))
    _close(ri.evaluate_circuit(model, toks, metric, ri.edge_layout(model).edges(), reference=ref), clean, model, "every edge")
    _close(ri.evaluate_circuit(model, toks, metric, [], reference=ref), reference, model, "no edge")


def second_order(model, toks, ref):
    """Each head's sources sum to its direct part, which is its DLA contribution at the position."""
    targets = torch.randint(0, 299, toks.shape, generator=torch.Generator().manual_seed(5))
    so = ri.second_order_attribution(model, toks, targets=targets, positions=[-1])
    first = ri.direct_logit_attribution(model, toks, targets=targets)
    for d in ("L0H1", "L1H2"):
        got = so.contributions[:, so.destinations.index(d), :, 0].sum(0)
        want = first.contributions[first.labels.index(d), :, -1]
        assert float((got - want).abs().max()) <= _tol(model) * max(1.0, float(want.abs().max())), d


#: Each core helper: its brute-force check, and its name in rs_interp.exact.certificate.NEEDS.
HELPERS = {"direct_logit_attribution": dla, "attribution_patching": node, "edge_attribution_patching": edges,
           "head_ablation_scan": scan, "logit_lens": lens, "path_patching": path, "evaluate_circuit": circuit,
           "second_order_attribution": second_order}


@pytest.mark.parametrize("helper", list(HELPERS))
def test_every_helper_is_exact_or_refuses_by_name(loaded, tokens, helper):
    """The helper's number equals the brute force's, or it raises a ValueError naming an identity its
    certificate says fails (or a feature with no exact split, named); it refuses only then."""
    family, model, _, row = loaded
    if model is None:
        row[helper] = "-"
        pytest.skip(f"{family}: the load is refused by name (test_load_is_the_checkpoint_or_refused_by_name)")
    toks, ref = tokens
    needs = NEEDS[helper] + (NEEDS["direct_logit_attribution"] if helper == "second_order_attribution" else ())
    row[helper] = _exact_or_refused(family, helper, lambda: HELPERS[helper](model, toks, ref), ri.certify(model), needs,
                                    "soft-cap")


def _exact_or_refused(family: str, helper: str, call, cert, needs: tuple[str, ...], excuse: str) -> str:
    """``"exact"`` where ``call`` answers (and every identity ``needs`` holds), ``"refused: ..."`` where it raises a
    ValueError naming an identity the certificate says fails (or ``excuse``, a configuration refused by name)."""
    try:
        call()
    except ValueError as err:
        named = [n for n in cert.failed() if f"'{n}'" in str(err)]
        assert named or excuse in str(err), f"{family}, {helper}: refused without naming a failing identity: {err}"
        assert excuse in str(err) or not cert.holds(*needs), f"{family}, {helper}: refused although every identity it needs holds"
        return "refused: " + (", ".join(named) or excuse)
    assert cert.holds(*needs), f"{family}, {helper}: returned a number although {set(cert.failed()) & set(needs)} fail"
    return "exact"


#: Edge attribution patching, path patching and circuit evaluation: the docs' "edge methods".
EDGE_METHODS = ("edge_attribution_patching", "path_patching", "evaluate_circuit")


def summary(row: dict[str, str]) -> str:
    """One family's outcome as the docs' table words it (docs/capabilities/models.md)."""
    if row["load"] == "refused":
        return "refused at load"
    refused = {h: v.split(": ", 1)[1] for h, v in row.items() if h != "load" and v.startswith("refused")}
    reasons = sorted(set(refused.values()))
    if not refused:
        return "exact"
    if len(reasons) == 1 and set(refused) == set(EDGE_METHODS):
        return f"exact; edge methods refused ({reasons[0]})"
    if len(reasons) == 1 and set(refused) == set(HELPERS) - {"attribution_patching", "head_ablation_scan", "logit_lens"}:
        return f"node attribution, scan and lens exact; the rest refused ({reasons[0]})"
    return "exact; refused: " + "; ".join(f"{h} ({r})" for h, r in refused.items())


def test_the_docs_table_says_what_was_measured(table):
    """Runs after the family tests (file order): each family measured here has the docs' row for this
    TransformerLens version, word for word."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "capabilities" / "models.md").read_text()
    section = text.split("## Every other family", 1)[1].split("\n## ", 1)[0]
    column = 1 if _backend.TL_MAJOR == 3 else 2
    docs = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and not cells[0].startswith(("family", "---")):
            name = re.sub(r" \(float64\)$", "", cells[0])
            docs[name] = cells[column]
    measured = {f"{family} ({dtype})" if dtype != "float64" else family: summary(row)
                for (family, dtype), row in table.items() if len(row) == len(HELPERS) + 1}
    if not measured:
        pytest.skip("no family was measured in this session (run the whole module)")
    assert {k: docs.get(k) for k in measured} == measured


# --- causal variables (issue 63): interchange and head affinities, exact or refused by name -----------------

def _interchange(model, toks, ref):
    from rs_interp.variables import PairSet, Site, interchange, random_basis
    from tests.variables.test_interchange import brute_force

    last = torch.full((toks.shape[0],), toks.shape[1] - 1)
    pairs = PairSet(base=toks, source=ref, labels=torch.zeros(len(toks), dtype=torch.long),
                    base_labels=torch.ones(len(toks), dtype=torch.long), read=last, candidates=torch.tensor([[1, 2]] * 3),
                    base_positions=last - 2, source_positions=last)
    for site in (Site("blocks.1.hook_resid_pre"), Site("blocks.1.attn.hook_z", 2)):
        basis = random_basis(site.width(model), 3, seed=0, dtype=model.cfg.dtype)
        got = interchange(model, pairs, site, basis, progress=False)
        with torch.no_grad():
            want = brute_force(model, pairs, site, basis).to(torch.float64)
        _close(float((got.logits.to(torch.float64) - want).abs().max()), 0.0, model, str(site))


def _affinity(model, toks, ref):
    from tests.heads.test_affinity import brute_force

    got, want = ri.head_affinity(model, "v").scores, brute_force(model, "v")
    mask = ~want.isnan()
    _close(float((got.to(torch.float64)[mask] - want[mask]).abs().max()), 0.0, model, "OV affinity")


#: The helpers of issue 63, with their brute forces (not in HELPERS: the docs' table of families reads those).
VARIABLES = {"variables.interchange": _interchange, "head_affinity": _affinity}


@pytest.mark.parametrize("helper", list(VARIABLES))
def test_causal_variable_helpers_are_exact_or_refuse_by_name(loaded, tokens, helper):
    """As the core helpers above: the number of a brute force written apart, or a ValueError naming an identity
    the certificate says fails (or post-norm blocks, which head affinities refuse as the composition scores do)."""
    family, model, _, _ = loaded
    if model is None:
        pytest.skip(f"{family}: the load is refused by name (test_load_is_the_checkpoint_or_refused_by_name)")
    toks, ref = tokens
    needs = NEEDS[helper] + (("stream", "z") if helper.startswith("variables") else ())
    _exact_or_refused(family, helper, lambda: VARIABLES[helper](model, toks, ref), ri.certify(model), needs, "post-norm")


# --- the feature graph (issue 52), on the ten families its must-show names ---------------------------

#: The families issue 52's must-show names (GPT-J's checkpoint as tests/integration/test_pretrained.py builds it).
GRAPH_FAMILIES = ("gemma2", "gemma3", "olmo2", "bloom", "cohere", "falcon", "gpt_neo", "opt", "phi", "gptj")


@pytest.fixture(scope="module", params=GRAPH_FAMILIES)
def graph_model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_checkpoint(request.param, folder)
    try:
        return request.param, ri.load_pretrained(folder, dtype=torch.float64)
    except ValueError as err:  # test_load_is_the_checkpoint_or_refused_by_name checks the words
        return request.param, err


def _mlp_norm(model, l):
    """``(stream hook, norm)``: where layer ``l``'s MLP reads the stream, and the norm it reads it through, written
    out here as ``x -> (gain * c(x) / s, bias)`` for a scale ``s``: the block's ``ln2``; on a parallel block with one
    input norm, ``ln1`` of ``resid_pre``; on OLMo-2 (a norm only after each sublayer) none. Hugging Face modules:
    ``nn.LayerNorm`` (centred, its bias), Cohere's LayerNorm (centred, no bias), RMSNorm (Gemma's gain ``1 + w``);
    3.x's own modules by their class, ``w``/``b`` and the config's ``eps``."""
    block, parallel = model.blocks[l], bool(getattr(model.cfg, "parallel_attn_mlp", False))
    stream = f"blocks.{l}.hook_resid_{'pre' if parallel else 'mid'}"
    module = block._modules.get("ln2", block._modules.get("ln1") if parallel else None)
    if module is None or getattr(model.cfg, "original_architecture", None) == "Olmo2ForCausalLM" and _backend.TL_MAJOR == 3:
        return stream, None
    hf = getattr(module, "original_component", None)
    if hf is None:
        kind = type(module).__name__
        gain = module.w.detach() if hasattr(module, "w") else torch.ones(model.cfg.d_model, dtype=torch.float64)
        bias = module.b.detach() if hasattr(module, "b") else None
        centres, eps = kind.startswith("LayerNorm"), model.cfg.eps
    else:
        name = type(hf).__name__
        w = hf.weight.detach().to(torch.float64)
        gain = 1 + w if name.startswith("Gemma") else w
        centres = isinstance(hf, torch.nn.LayerNorm) or name == "CohereLayerNorm"
        bias = getattr(hf, "bias", None)
        bias = None if bias is None else bias.detach().to(torch.float64)
        eps = float(getattr(hf, "eps", getattr(hf, "variance_epsilon", None)))
    centre = (lambda x: x - x.mean(-1, keepdim=True)) if centres else (lambda x: x)
    return stream, (gain, centre, bias, eps)


class FrozenByHand:
    """The frozen replacement model of one prompt by brute force (as tests/features/test_graph.py's, written apart
    from rs_interp): a clean run, then plain hooks on the raw forward that put back every attention pattern and
    norm scale of the clean run (each head's output made from its clean pattern: :meth:`frozen_z`), give each MLP's
    output its clean value plus the change made, and read each
    transcoder's input off the stream the MLP reads through its norm written out with the clean run's scale
    (:func:`_mlp_norm`)."""

    def __init__(self, model, tcs, tokens):
        self.model, self.tcs, self.tokens, L = model, tcs, tokens[None], model.cfg.n_layers
        self.reads = [_mlp_norm(model, l) for l in range(L)]
        names = [n for n in model.hook_dict if n.endswith(("attn.hook_pattern", "hook_scale"))]
        names += ["hook_embed"] + [s for s, _ in self.reads] + [f"blocks.{l}.hook_mlp_out" for l in range(L)]
        self.cache = _record(model, self.tokens, names)
        self.scales = []
        for stream, norm in self.reads:
            r = self.cache[stream][0].to(torch.float64)
            self.scales.append(None if norm is None else (norm[1](r).pow(2).mean(-1, keepdim=True) + norm[3]).sqrt())
        self.x = [self.mlp_in(l, self.cache[s][0]) for l, (s, _) in enumerate(self.reads)]
        self.out = [self.cache[f"blocks.{l}.hook_mlp_out"][0] for l in range(L)]
        self.embed = self.cache["hook_embed"][0]

    def mlp_in(self, l, resid):
        norm = self.reads[l][1]
        if norm is None:
            return resid.to(torch.float64)
        gain, centre, bias, _ = norm
        y = gain * centre(resid.to(torch.float64)) / self.scales[l]
        return y if bias is None else y + bias

    def frozen_z(self, l, v):
        """Each head's output ``pattern v`` with the clean pattern, written at ``hook_z`` too: where the attention hands
        its whole computation to a Hugging Face module (GPT-Neo, GPT-J on 4.3), an edit at ``hook_pattern`` is
        discarded (elsewhere ``hook_z`` is this already). A key/value head serves its group of query heads."""
        A = self.cache[f"blocks.{l}.attn.hook_pattern"]
        v = v.repeat_interleave(A.shape[1] // v.shape[2], dim=2)
        return torch.einsum("bhqk,bkhd->bqhd", A, v)

    def run(self, *, embed_delta=None, out_delta=None):
        model, box, L = self.model, {}, self.model.cfg.n_layers
        hooks = [(n, lambda t, hook: self.cache[hook.name]) for n in self.cache if n.endswith(("attn.hook_pattern", "hook_scale"))]
        if embed_delta is not None:
            hooks.append(("hook_embed", lambda t, hook: t + embed_delta[None]))
        for l, (stream, _) in enumerate(self.reads):
            hooks += [(f"blocks.{l}.attn.hook_v", lambda t, hook, l=l: box.__setitem__(("v", l), t)),
                      (f"blocks.{l}.attn.hook_z", lambda t, hook, l=l: self.frozen_z(l, box[("v", l)]))]
            hooks.append((stream, lambda t, hook, l=l: box.__setitem__(l, self.mlp_in(l, t[0]))))
            hooks.append((f"blocks.{l}.hook_mlp_out",
                          lambda t, hook, l=l: (self.out[l] + (0 if out_delta is None else out_delta[l]))[None].to(t.dtype)))
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            logits = model(self.tokens)[0].to(torch.float64)
        return [box[l] for l in range(L)], logits

    def targets(self, graph, xs, logits):
        pre = [xs[l][p] @ self.tcs[l].W_enc[f] + self.tcs[l].b_enc[f] for l, p, f in graph.features.tolist()]
        last = logits[graph.position]
        return torch.cat([torch.stack(pre) if pre else last[:0], (last - (last.mean() if graph.centered else 0))[graph.logit_tokens]])


def test_the_feature_graph_is_the_frozen_replacement_or_refused_by_name(graph_model):
    """Every row of the feature graph (random transcoders at the MLPs' inputs and outputs) is the frozen replacement
    model's value, and doubling a node's write (a feature's activation, an error vector, a token's embedding) moves
    each row by the node's column (:class:`FrozenByHand`), and ``features.intervene`` doubling it moves them by as
    much; or a ValueError naming an identity the certificate says fails, or the soft-cap."""
    from rs_interp.features import attribution_graph, intervene
    from tests.features.test_transcoders import random_transcoders

    family, model = graph_model
    if isinstance(model, ValueError):
        pytest.skip(f"{family}: the load is refused by name (test_load_is_the_checkpoint_or_refused_by_name)")
    d, L, P = model.cfg.d_model, model.cfg.n_layers, 9
    tcs = random_transcoders(L, d, 24, seed=2)
    tokens = torch.randint(0, 299, (P,), generator=torch.Generator().manual_seed(3))
    cert = ri.certify(model)
    try:
        g = attribution_graph(model, tcs, tokens, targets=[0, 7, 21], position=-2)
    except ValueError as err:
        named = [n for n in cert.failed() if f"'{n}'" in str(err)]
        assert named or "soft-cap" in str(err), f"{family}: refused without naming a failing identity: {err}"
        assert "soft-cap" in str(err) or not cert.holds(*NEEDS["features.attribution_graph"]), f"{family}: refused although it holds"
        return
    assert cert.holds(*NEEDS["features.attribution_graph"])
    bf = FrozenByHand(model, tcs, tokens)
    base = bf.targets(g, *bf.run())
    rows = torch.cat([torch.arange(g.n_features), torch.arange(g.n_nodes - g.n_logits, g.n_nodes)])
    gap = float((g.values[rows] - base).abs().max())
    assert gap <= _tol(model) * max(1.0, float(base.abs().max())), f"{family}: rows {gap}"
    assert g.n_features > 8
    for n in list(range(0, g.n_features, g.n_features // 4))[:4] + [g.error_node(0, 5), g.error_node(1, 3), g.token_node(4)]:
        embed_delta, out_delta = node_write(bf, g, tcs, n)
        moved = bf.targets(g, *bf.run(embed_delta=embed_delta, out_delta=out_delta)) - base
        gap = float((g.adjacency[rows, n] - moved).abs().max())
        assert gap <= _tol(model) * max(1.0, float(moved.abs().max())), f"{family}: node {g.labels()[n]}: {gap}"
        gap = float((intervene(model, tcs, g, [n], scale=2.0).actual - moved).abs().max())  # the library's frozen run
        assert gap <= _tol(model) * max(1.0, float(moved.abs().max())), f"{family}: intervene on {g.labels()[n]}: {gap}"


def _bias_free_copy(model):
    """A copy of ``model`` with every bias zero (attention, MLP, norms, unembedding): parameters named ``bias`` or ``b_*``,
    and the unembedding's bias where a bridge keeps it as a buffer (OPT's, GPT-Neo's, GPT-BigCode's on 4.x)."""
    copy = ri.as_dtype(model, model.cfg.dtype)
    with torch.no_grad():
        for name, p in [*copy.named_parameters(), *((n, b) for n, b in copy.named_buffers() if n.startswith("unembed."))]:
            leaf = name.rsplit(".", 1)[-1]
            if (leaf == "bias" or leaf.startswith("b_")) and p.is_floating_point():
                p.zero_()
    return copy


def test_relevance_patching_is_conserved_or_refused_by_name(loaded, tokens):
    """Issue 66: relevance patching on each family's bias-free copy conserves relevance (rs_interp.circuits.relevance):
    with zero ablation, the edges crossing every layer boundary sum to ``-g . logits`` (``g`` the metric's gradient at
    the logits before any soft-cap); or it refuses, naming an identity that fails on the model."""
    family, model, _, _ = loaded
    if model is None:
        pytest.skip(f"{family}: the load is refused by name")
    from rs_interp.circuits.graph import depth

    copy = _bias_free_copy(model)
    toks, _ = tokens
    cert = ri.certify(copy)
    try:
        relp = ri.edge_relevance_patching(copy, toks, metric, ablation="zero")
    except ValueError as err:
        named = [n for n in cert.failed() if f"'{n}'" in str(err)]
        assert named and not cert.holds(*NEEDS["edge_relevance_patching"]), f"{family}: {err}"
        print(f"\n{family}: relevance patching refused ({', '.join(named)})")
        return
    assert cert.holds(*NEEDS["edge_relevance_patching"])
    with torch.enable_grad():
        logits = copy(toks).detach().to(torch.float64).requires_grad_(True)
        (g,) = torch.autograd.grad(metric(logits), logits)
    cap = _backend.logit_softcap(copy)
    if cap is not None:  # the identity is in the logits before the cap
        g, logits = g * (1 - (logits / cap) ** 2), cap * torch.atanh(logits / cap)
    total = -float((g * logits.detach()).sum())
    parallel = bool(getattr(copy.cfg, "parallel_attn_mlp", False))
    ds = torch.tensor([depth(s, parallel=parallel) for s in relp.layout.senders])
    dr = torch.tensor([depth(r, parallel=parallel) for r in relp.layout.receivers])
    for l in range(copy.cfg.n_layers + 1):
        crossing = (ds[:, None] < 2 * l + 1) & (dr[None, :] >= 2 * l + 1)
        _close(float(relp.effect[crossing].sum()), total, copy, f"{family}: the edges crossing layer {l}'s boundary")
