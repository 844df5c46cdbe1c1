"""What the certificate measures, and what each helper relies on, declared beside the helper.

A helper that takes a model says what it relies on with the :func:`needs` decorator on its ``def``
(``@needs("z", "input", "gradients", adapts=QK_FIX)``); the tables the certificate, the docs and the tests read
(:data:`NEEDS`, :data:`OPTIONAL`, :data:`ADAPTS`, :data:`REFUSES`) are generated from those declarations, and a
wrapper that runs another helper batch by batch (``rs_interp.scale``) takes the other's declaration
(``@needs(like=edge_attribution_patching)``) instead of a copy of it. Read by
:mod:`rs_interp.exact.certificate` (which measures and refuses), the docs' identity x helper table and the test
that walks the public API (``tests/integration/test_certificate_api.py``: every public function that takes a
model is in :data:`NEEDS` or in :data:`EXEMPT` with a reason).

The decorator only records (it returns the function itself, with its declaration as ``__needs__``): a helper's
signature, docstring and results are its own. A helper's module declares it when it is imported, so a
helper's first call (``require(model, helper)``) finds its line at once; reading the whole table (iterating
:data:`NEEDS`, ``certify(model).table()``) first imports every module of :data:`HELPER_PACKAGES`, so the table
never depends on what happened to be imported. ``import rs_interp`` stays light: this module reads only the
standard library.

Keys are public names as a user calls them: ``"direct_logit_attribution"`` is ``rs_interp.direct_logit_attribution``,
``"features.attribution_graph"`` is ``rs_interp.features.attribution_graph``.

>>> import rs_interp as ri
>>> ri.edge_attribution_patching.__needs__.identities == NEEDS["edge_attribution_patching"] == EDGE_ESTIMATES
True
>>> NEEDS["scale.edge_attribution_patching"] == NEEDS["edge_attribution_patching"]  # declared like= it
True
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, TypeVar

from .._messages import few

__all__ = ["IDENTITIES", "NEEDS", "OPTIONAL", "ADAPTS", "EXEMPT", "CONDITIONS", "REFUSES", "Needs", "needs",
           "HELPER_PACKAGES", "EDGES", "EVALUATED", "EDGE_ESTIMATES", "PATTERNS", "GRAPH", "RELEVANCE",
           "MLP_IO", "QK_FIX", "ONE_PASS_EACH", "LENS_ONE_PASS", "BACKWARD_BY_AUTOGRAD", "QK_SCORES", "TRANSCODERS",
           "SITES"]

#: What each identity says, in the order of the table.
IDENTITIES: dict[str, str] = {
    "embedding": "blocks.0.hook_resid_pre = hook_embed (+ hook_pos_embed for learned positions)",
    "stream": "each block adds its outputs: resid_pre + attn_out = resid_mid, resid_mid + mlp_out = resid_post "
              "(parallel: resid_pre + attn_out + mlp_out = resid_post); resid_post = the next resid_pre",
    "z": "hook_z is on the forward path (the heads' outputs are made from it)",
    "heads": "the heads' z W_O, summed, plus b_O are attn_out (a head writes z W_O into the stream; on post-norm "
             "blocks through the norm after the attention, its scale frozen: gain * (z W_O) / s)",
    "values": "each head's z is its pattern times ln1(resid_pre) W_V + b_V",
    "scores": "each head's pattern is the causal softmax of q k^T / scale, q and k ln1(resid_pre) W + b (rotated on "
              "rotary models): the attention score is the bilinear form of the stream the weights say",
    "scores read": "what rs_interp reads as a head's pre-softmax scores (hook_attn_scores, or its emulation) gives "
                   "the pattern by the causal softmax: the scores read are the run's",
    "projections": "hook_q, hook_k, hook_v are ln1(resid_pre) W + b per head, where edge methods read them so",
    "input": "blocks.0.hook_resid_pre is on the forward path",
    "readers": "the heads' q, k, v inputs, the MLPs' inputs (hook_mlp_in) and the final stream are every reader of "
               "the stream: their gradients add up to the stream's; the run through the per-head inputs gives the "
               "model's own logits",
    "head inputs": "moving one head's (or KV head's) q, k or v input (hook_{q,k,v}_input) changes only that head's q, "
                   "k or v: no norm or hook across the heads carries it to another head (a q/k norm spanning the "
                   "heads, OLMo-2's, is applied to each head's own copy)",
    "mlp reads": "each MLP reads ln2(resid_mid) (parallel blocks: ln2(resid_pre), or ln1(resid_pre) where one input "
                 "norm is shared), the norm as the model computes it: what a transcoder reads at ln2.hook_normalized "
                 "(with the gain and bias) or hook_resid_mid is the MLP's input",
    "mlp writes": "what enters the stream from each MLP (hook_mlp_out) is the MLP module's own output (post-norm "
                  "blocks: the norm after the MLP of it): no hook or other norm between the MLP and the stream "
                  "changes it",
    "mlp weights": "each MLP's output is its weights' function of its input, W_out act(W_in x + b_in) + b_out (gated: "
                   "(act(x W_gate) * (x W_in) + b_in) W_out + b_out on 3.x, b_in inside the product on 4.x)",
    "readout": "the logits are the unembedding of the final norm of the final stream (soft-cap included)",
    "vocabulary": "the logits have d_vocab_out entries, one per column of W_U",
    "gradients": "the backward pass is the derivative of the forward: no backward hook changes a gradient",
    "rows": "each batch row is computed on its own: a batch stacked with another, or permuted, gives every row what "
            "the row gives alone",
    "start at layer": "model(resid_pre_l, start_at_layer=l) reproduces the full run",
    "stop at layer": "model(tokens, stop_at_layer=l) returns blocks.l.hook_resid_pre (the final stream for n_layers)",
    "source": "the log-probabilities are those of the checkpoint the model was loaded from (load_pretrained)",
}

#: Identities many helpers share (a helper's declaration names them: ``@needs(*EDGES)``).
EDGES = ("stream", "z", "heads", "readers", "head inputs")
#: A cut head's q/k/v is built by hand where hook_{q,k,v} are the projections.
EVALUATED = (*EDGES, "projections")
EDGE_ESTIMATES = ("stream", "z", "heads", "input", "readers", "projections", "gradients", "head inputs")
PATTERNS = ("z", "values")
GRAPH = ("embedding", "stream", "mlp reads", "mlp writes", "readout", "vocabulary")
#: Relevance patching: the layers swept backwards by hand, each held at the run (no backward pass of the model).
RELEVANCE = ("stream", "z", "heads", "values", "mlp reads", "mlp writes", "mlp weights", "readout")
MLP_IO = ("mlp reads", "mlp writes")

#: What helpers do where an identity they adapt to fails (``adapts=``): they still answer, exactly.
ONE_PASS_EACH = {"rows": "one pass per ablation or edge instead of several stacked along the batch",
                 "start at layer": "every pass from the tokens instead of from the cached stream"}
LENS_ONE_PASS = {"rows": "the batch read in one pass (memory_budget and batch_chunk then not applied)"}
QK_FIX = {"rows": "the QK fix's patched copies one pass each instead of stacked along the batch",
          "scores": "the QK fix's patterns by the model's own attention instead of from the projections",
          "start at layer": "the QK fix's passes from the tokens instead of from the cached stream"}
BACKWARD_BY_AUTOGRAD = {
    name: "the blocks' backward passes by autograd instead of written out from the weights"
    for name in ("stream", "heads", "values", "scores", "mlp reads", "mlp writes", "mlp weights")}

#: Identities needed for some arguments only (``optional=``), with when.
QK_SCORES = {"scores": "which='q' or 'k'"}
TRANSCODERS = {"mlp weights": "exact transcoders (features.mlp_transcoders)"}
SITES = {"stream": "a residual site", "input": "site blocks.0.hook_resid_pre", "z": "a head's site (hook_z)",
         "mlp weights": "an MLP's neurons (hook_post)"}

#: Public functions that take a model and rely on no identity, each with why.
EXEMPT: dict[str, str] = {
    "certify": "it measures the identities",
    "as_dtype": "a copy of the model in another dtype: the copy is certified when a helper uses it",
    "models.save_model": "writes the weights and config; nothing is computed",
    "ungroup_gqa": "a copy of the model with each KV head's weights repeated per query head (the same function, "
                   "tested): the copy is certified when a helper uses it",
    "induction_batch": "reads the vocabulary size and context length only",
    "score_model": "the model's own loss and accuracy: its logits as they are, nothing decomposed",
    "scale.metric_values": "the metric of the model's own logits, batch by batch: nothing decomposed",
    "scale.stream": "runs the analysis it is given, which certifies the model itself",
    "scale.run_method": "runs the scale helper of the registry entry's helper (scale.<helper>), which certifies the "
                        "model",
    "features.estimate_graph": "reads the config's shapes only; nothing is run",
    "hooks.store_matching": "builds hooks that record activations; nothing is computed",
    "hooks.split_qkv_inputs": "routes the caller's own per-head input hooks; the caller's hooks say what they compute",
    "variables.untrained_copy": "a copy of the model with its weights drawn afresh (the DAS control): the copy is "
                                "certified when a helper uses it",
}

#: Configurations no identity can make exact for some helper: what each means (the certificate reads
#: each off the config, :data:`rs_interp.exact.certificate.CONFIGURATIONS`).
CONDITIONS: dict[str, str] = {
    "soft-capped logits": "the logits pass a soft-cap c tanh(l / c): no split of a logit over components is exact "
                          "through it, and the logits are not linear in the final stream",
    "MLPs or a norm": "the path expansion is the sum over head chains of an attention-only, norm-free model; "
                      "rs_interp.direct_logit_attribution splits such a model exactly, each norm's scale frozen",
    "not rotary": "the score of the query and key biases alone depends on the offset only under rotary positions",
    "attention-only": "there is no MLP for transcoders to replace",
    "parallel blocks": "the MLP reads the block's input, not the stream after the attention: the query/key split of "
                       "features is not built or tested for it (the feature graph and interventions are)",
    "post-norm blocks": "a head's write is z W_O times gain / s, s the scale of its whole attention's output at each "
                        "token (the norm after the sublayer): no product of weights alone is what one head passes on; "
                        "and what an MLP writes is the norm of its neurons' sum, which its neurons alone are not a "
                        "transcoder of",
    "not plain ReLU MLPs": "the neurons of a gated or non-ReLU MLP are not a transcoder (train one: "
                           "features.train_transcoder)",
    "bidirectional attention": "the Jacobian lens's estimator sums d h_final[t'] / d h_l[t] over t' >= t by planting "
                               "each backward pass's cotangent at every position at once, which only causal attention "
                               "makes that sum",
}

#: The packages whose modules declare helpers: reading the whole table imports each of their modules first.
HELPER_PACKAGES = ("readouts", "heads", "circuits", "features", "scale", "variables")

#: The certificate's table's rows in the order it has always shown them (the docs' table, ``certify(model)``'s
#: printout); a helper not listed here (a new one) follows, by name. Only the order: what each needs is its own
#: declaration's.
_ROWS = (
    "direct_logit_attribution", "second_order_attribution", "path_expansion", "path_logit_attribution", "logit_lens",
    "lens_kl", "train_tuned_lens", "fit_jacobian_lens", "jacobian_lens", "lens_vectors", "lens_steering_hooks",
    "lens_ablation_hooks", "lens_swap_hooks", "jspace_decomposition", "jspace_occupancy", "jspace_variance",
    "coordinate_patch", "coordinate_patch_hooks", "attribution_patching", "edge_attribution_patching",
    "fix_unreliable", "edge_relevance_patching", "relevance_patching", "path_patching", "evaluate_circuit",
    "faithfulness_curve", "mib_scores", "acdc", "head_ablation_scan", "ablate_heads", "run_with_key_input",
    "run_with_query_input", "composition_scores", "virtual_weight", "copying_scores", "attention_patterns",
    "prev_token_scores", "find_prev_token_head", "induction_scores", "first_token_attention", "positional_scores",
    "key_score_sensitivity", "features.attribution_graph", "features.intervene", "features.qk_attributions",
    "features.top_attention", "features.train_transcoder", "features.transcoder_metrics", "features.train_clt",
    "features.mlp_transcoders", "scale.attribution_patching", "scale.edge_attribution_patching",
    "scale.edge_relevance_patching", "scale.path_patching", "scale.evaluate_circuit", "scale.faithfulness_curve",
    "scale.mib_scores", "scale.head_ablation_scan", "scale.direct_logit_attribution", "scale.logit_lens",
    "scale.lens_kl", "variables.interchange", "variables.das", "variables.activations", "head_affinity",
    "head_affinities",
)


@dataclass(frozen=True)
class Needs:
    """What one helper relies on (its :func:`needs` declaration).

    Attributes:
        name: the helper's public name (``"features.attribution_graph"``).
        identities: the identities it needs: it refuses, naming the first that fails.
        optional: identities it needs for some arguments only, each with when.
        adapts: identities it reads as an option, each with what it does where one fails (it still answers).
        refuses: the configurations of :data:`CONDITIONS` it refuses by name, before any measurement.
        where: the function's module and name (a module imported twice declares the same helper again).
        like: the helper whose declaration this one takes (``scale.X`` runs ``X`` batch by batch), or ``""``.
    """

    name: str
    identities: tuple[str, ...]
    optional: Mapping[str, str] = field(default_factory=dict)
    adapts: Mapping[str, str] = field(default_factory=dict)
    refuses: tuple[str, ...] = ()
    where: str = ""
    like: str = ""


_DECLARED: dict[str, Needs] = {}
_F = TypeVar("_F", bound=Callable[..., Any])


def needs(*identities: str, name: str | None = None, like: Callable[..., Any] | None = None,
          optional: Mapping[str, str] | None = None, adapts: Mapping[str, str] | None = None,
          refuses: tuple[str, ...] = ()) -> Callable[[_F], _F]:
    """Declare what the decorated helper relies on; it returns the function itself (``fn.__needs__`` set).

    Args:
        *identities: the identities of :data:`IDENTITIES` it needs.
        name: its public name where that is not the function's own (``"features.train_clt"``).
        like: another helper (the function) whose whole declaration this one takes: a wrapper that runs it.
        optional: ``{identity: "when"}``, needed for some arguments only.
        adapts: ``{identity: "what it does where it fails"}``, read as an option.
        refuses: configurations of :data:`CONDITIONS` refused by name.

    Raises:
        ValueError: an unknown identity or configuration, ``like`` with a declaration of its own, ``like`` a
            function that declares nothing, a module outside :data:`HELPER_PACKAGES`, or a name declared twice.

    >>> import rs_interp as ri
    >>> ri.copying_scores.__needs__.identities, ri.copying_scores.__needs__.refuses
    (('heads', 'values'), ('post-norm blocks',))
    """
    own = bool(identities or optional or adapts or refuses)

    def declare(fn: _F) -> _F:
        key, where = name or fn.__name__, f"{fn.__module__}.{fn.__qualname__}"
        if like is not None:
            base = getattr(like, "__needs__", None)
            if base is None or own:
                raise ValueError(f"{key}: like= takes a declared helper's whole declaration, and nothing else")
            declared = Needs(key, base.identities, base.optional, base.adapts, base.refuses, where, base.name)
        else:
            declared = Needs(key, tuple(identities), dict(optional or {}), dict(adapts or {}), tuple(refuses), where)
        _check(declared, fn.__module__)
        fn.__needs__ = declared  # type: ignore[attr-defined]
        _DECLARED[key] = declared
        return fn

    return declare


def _check(declared: Needs, module: str) -> None:
    named = {*declared.identities, *declared.optional, *declared.adapts}
    if named - set(IDENTITIES) or set(declared.refuses) - set(CONDITIONS):
        raise ValueError(f"{declared.name}: no identity or configuration "
                         f"{few(sorted(named - set(IDENTITIES) | set(declared.refuses) - set(CONDITIONS)))}")
    parts = module.split(".")
    if len(parts) < 3 or parts[0] != "rs_interp" or parts[1] not in HELPER_PACKAGES:  # never in a full read
        raise ValueError(f"{declared.name}: declared in {module}, outside rs_interp's {HELPER_PACKAGES}")
    before = _DECLARED.get(declared.name)
    if before is not None and before.where != declared.where:
        raise ValueError(f"{declared.name} is declared twice: {before.where} and {declared.where}")


_LOADED: list[bool] = []  # [True] once every module of HELPER_PACKAGES has been imported (each declares its helpers)


def _load_all() -> None:
    """Import every module of :data:`HELPER_PACKAGES`, once: the whole table is then declared."""
    if _LOADED:
        return
    _LOADED.append(True)  # first: a module that reads the table while it is imported does not start again
    try:
        for package in HELPER_PACKAGES:
            root = importlib.import_module(f"rs_interp.{package}")
            for info in pkgutil.walk_packages(root.__path__, f"{root.__name__}."):
                importlib.import_module(info.name)
    except BaseException:
        _LOADED.clear()
        raise


class _Table(Mapping[str, Any]):
    """A table generated from the declarations: ``{helper: what its declaration says}``, read-only. Looking up a
    helper whose module is imported reads its declaration; iterating (or a helper not yet declared) imports
    every helper's module first (:func:`_load_all`)."""

    def __init__(self, read: Callable[[Needs], Any]) -> None:
        self._read = read

    def __getitem__(self, helper: str) -> Any:
        if helper not in _DECLARED:
            _load_all()
        declared = _DECLARED.get(helper)
        value = None if declared is None else self._read(declared)
        if value is None:
            raise KeyError(helper)
        return value

    def __iter__(self) -> Iterator[str]:
        _load_all()
        order = {name: i for i, name in enumerate(_ROWS)}
        names = sorted(_DECLARED, key=lambda name: (order.get(name, len(order)), name))
        return iter([name for name in names if self._read(_DECLARED[name]) is not None])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return repr(dict(self))


#: The identities each helper relies on: it refuses, naming the first that fails.
NEEDS: Mapping[str, tuple[str, ...]] = _Table(lambda d: d.identities)
#: Identities a helper needs only for some arguments: ``{helper: {identity: "when"}}``.
OPTIONAL: Mapping[str, Mapping[str, str]] = _Table(lambda d: d.optional or None)
#: Identities a helper reads as an option, with what it does where one fails (it still answers, exactly).
ADAPTS: Mapping[str, Mapping[str, str]] = _Table(lambda d: d.adapts or None)
#: The configurations of :data:`CONDITIONS` each helper refuses by name, before any measurement.
REFUSES: Mapping[str, tuple[str, ...]] = _Table(lambda d: d.refuses or None)
