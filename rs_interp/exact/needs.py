"""What the certificate measures and what each helper relies on: data only, read by
:mod:`rs_interp.exact.certificate` (which measures and refuses), the docs' identity x helper table and the
test that walks the public API (``tests/integration/test_certificate_api.py``: every public function that takes a
model is in :data:`NEEDS` or in :data:`EXEMPT` with a reason).

Keys are public names as a user calls them: ``"direct_logit_attribution"`` is ``rs_interp.direct_logit_attribution``,
``"features.attribution_graph"`` is ``rs_interp.features.attribution_graph``.
"""

from __future__ import annotations

__all__ = ["IDENTITIES", "NEEDS", "OPTIONAL", "ADAPTS", "EXEMPT", "CONDITIONS", "REFUSES"]

#: What each identity says, in the order of the table.
IDENTITIES: dict[str, str] = {
    "embedding": "blocks.0.hook_resid_pre = hook_embed (+ hook_pos_embed for learned positions)",
    "stream": "each block adds its outputs: resid_pre + attn_out = resid_mid, resid_mid + mlp_out = resid_post "
              "(parallel: resid_pre + attn_out + mlp_out = resid_post); resid_post = the next resid_pre",
    "z": "hook_z is on the forward path (the heads' outputs are made from it)",
    "heads": "the heads' z W_O, summed, plus b_O are attn_out (a head writes z W_O into the stream; on post-norm blocks "
             "through the norm after the attention, its scale frozen: gain * (z W_O) / s)",
    "values": "each head's z is its pattern times ln1(resid_pre) W_V + b_V",
    "scores": "each head's pattern is the causal softmax of q k^T / scale, q and k ln1(resid_pre) W + b (rotated on "
              "rotary models): the attention score is the bilinear form of the stream the weights say",
    "scores read": "what rs_interp reads as a head's pre-softmax scores (hook_attn_scores, or its emulation) gives the "
                   "pattern by the causal softmax: the scores read are the run's",
    "projections": "hook_q, hook_k, hook_v are ln1(resid_pre) W + b per head, where edge methods read them so",
    "input": "blocks.0.hook_resid_pre is on the forward path",
    "readers": "the heads' q, k, v inputs, the MLPs' inputs (hook_mlp_in) and the final stream are every reader "
               "of the stream: their gradients add up to the stream's; the run through the per-head inputs gives the "
               "model's own logits",
    "head inputs": "moving one head's (or KV head's) q, k or v input (hook_{q,k,v}_input) changes only that "
                   "head's q, k or v: no norm or hook across the heads carries it to another head (a q/k norm "
                   "spanning the heads, OLMo-2's, is applied to each head's own copy)",
    "mlp reads": "each MLP reads ln2(resid_mid) (parallel blocks: ln2(resid_pre), or ln1(resid_pre) where one input norm "
                 "is shared), the norm as the model computes it: "
                 "what a transcoder reads at ln2.hook_normalized (with the gain and bias) or hook_resid_mid is the MLP's input",
    "mlp writes": "what enters the stream from each MLP (hook_mlp_out) is the MLP module's own output (post-norm blocks: "
                  "the norm after the MLP of it): no hook or other norm between the MLP and the stream changes it",
    "mlp weights": "each MLP's output is its weights' function of its input, W_out act(W_in x + b_in) + b_out "
                   "(gated: (act(x W_gate) * (x W_in) + b_in) W_out + b_out on 3.x, b_in inside the product on 4.x)",
    "readout": "the logits are the unembedding of the final norm of the final stream (soft-cap included)",
    "vocabulary": "the logits have d_vocab_out entries, one per column of W_U",
    "gradients": "the backward pass is the derivative of the forward: no backward hook changes a gradient",
    "rows": "each batch row is computed on its own: a batch stacked with another, or permuted, gives every row "
            "what the row gives alone",
    "start at layer": "model(resid_pre_l, start_at_layer=l) reproduces the full run",
    "stop at layer": "model(tokens, stop_at_layer=l) returns blocks.l.hook_resid_pre (the final stream for n_layers)",
    "source": "the log-probabilities are those of the checkpoint the model was loaded from (load_pretrained)",
}

_EDGES = ("stream", "z", "heads", "readers", "head inputs")
_EVALUATED = (*_EDGES, "projections")  # a cut head's q/k/v is built by hand where hook_{q,k,v} are the projections
_EDGE_ESTIMATES = ("stream", "z", "heads", "input", "readers", "projections", "gradients", "head inputs")
_PATTERNS = ("z", "values")
_GRAPH = ("embedding", "stream", "mlp reads", "mlp writes", "readout", "vocabulary")
#: Relevance patching: the layers swept backwards by hand, each held at the run (no backward pass of the model).
_RELEVANCE = ("stream", "z", "heads", "values", "mlp reads", "mlp writes", "mlp weights", "readout")

#: The identities each helper relies on: it refuses, naming the first that fails.
NEEDS: dict[str, tuple[str, ...]] = {
    "direct_logit_attribution": ("embedding", "stream", "z", "heads", "readout", "vocabulary"),
    "second_order_attribution": ("embedding", "stream", "z", "heads", "values", "readout", "vocabulary"),
    "path_expansion": ("embedding", "stream", "z", "heads", "values", "readout", "vocabulary"),
    "path_logit_attribution": ("embedding", "stream", "z", "heads", "values", "readout", "vocabulary"),
    "logit_lens": ("readout", "stop at layer", "vocabulary"),
    "lens_kl": ("readout", "vocabulary"),
    "train_tuned_lens": ("readout", "vocabulary"),
    "fit_jacobian_lens": ("readout", "gradients"),
    "jacobian_lens": ("readout", "stop at layer", "vocabulary"),
    **{name: ("readout", "vocabulary") for name in (
        "lens_vectors", "lens_steering_hooks", "lens_ablation_hooks", "lens_swap_hooks", "jspace_decomposition",
        "jspace_occupancy", "jspace_variance", "coordinate_patch", "coordinate_patch_hooks")},
    "attribution_patching": ("z", "input", "gradients"),
    "edge_attribution_patching": _EDGE_ESTIMATES,
    "fix_unreliable": _EDGE_ESTIMATES,
    "edge_relevance_patching": _RELEVANCE,
    "relevance_patching": _RELEVANCE,
    "path_patching": _EDGES,
    "evaluate_circuit": _EVALUATED,
    "faithfulness_curve": _EVALUATED,
    "mib_scores": _EVALUATED,
    "acdc": _EVALUATED,
    "head_ablation_scan": ("z",),
    "ablate_heads": ("z",),
    "run_with_key_input": _EDGES,
    "run_with_query_input": _EDGES,
    "composition_scores": ("heads", "values"),
    "virtual_weight": ("heads", "values"),
    "copying_scores": ("heads", "values"),
    "attention_patterns": _PATTERNS,
    "prev_token_scores": _PATTERNS,
    "find_prev_token_head": _PATTERNS,
    "induction_scores": _PATTERNS,
    "first_token_attention": _PATTERNS,
    "positional_scores": ("scores",),
    "key_score_sensitivity": ("scores read",),
    "features.attribution_graph": (*_GRAPH, "gradients"),
    "features.intervene": _GRAPH,
    "features.qk_attributions": _GRAPH + ("z", "heads", "values", "scores", "head inputs", "gradients"),
    "features.top_attention": _GRAPH + ("z", "heads", "values"),
    "features.train_transcoder": ("mlp reads", "mlp writes"),
    "features.transcoder_metrics": ("mlp reads", "mlp writes"),
    "features.train_clt": ("mlp reads", "mlp writes"),
    "features.mlp_transcoders": ("mlp reads", "mlp writes", "mlp weights"),
    "scale.attribution_patching": ("z", "input", "gradients"),
    "scale.edge_attribution_patching": _EDGE_ESTIMATES,
    "scale.edge_relevance_patching": _RELEVANCE,
    "scale.path_patching": _EDGES,
    "scale.evaluate_circuit": _EVALUATED,
    "scale.faithfulness_curve": _EVALUATED,
    "scale.mib_scores": _EVALUATED,
    "scale.head_ablation_scan": ("z",),
    "scale.direct_logit_attribution": ("embedding", "stream", "z", "heads", "readout", "vocabulary"),
    "scale.logit_lens": ("readout", "stop at layer", "vocabulary"),
    "scale.lens_kl": ("readout", "vocabulary"),
    "variables.interchange": ("rows",),
    "variables.das": ("rows", "gradients"),
    "variables.activations": ("rows",),
    "head_affinity": ("heads", "values"),
    "head_affinities": ("heads", "values"),
}

#: Identities a helper needs only for some arguments: ``{helper: {identity: "when"}}``.
OPTIONAL: dict[str, dict[str, str]] = {
    "composition_scores": {"scores": "which='q' or 'k'"},
    "virtual_weight": {"scores": "which='q' or 'k'"},
    "head_affinity": {"scores": "which='q' or 'k'"},
    "head_affinities": {"scores": "which with 'q' or 'k'"},
    **{name: {"stream": "a residual site", "input": "site blocks.0.hook_resid_pre", "z": "a head's site (hook_z)",
              "mlp weights": "an MLP's neurons (hook_post)"}
       for name in ("variables.interchange", "variables.das", "variables.activations")},
    "head_ablation_scan": {"readout": "positions=", "stop at layer": "positions=", "vocabulary": "positions="},
    "scale.head_ablation_scan": {"readout": "positions=", "stop at layer": "positions=", "vocabulary": "positions="},
    "features.attribution_graph": {"mlp weights": "exact transcoders (features.mlp_transcoders)"},
    "features.intervene": {"mlp weights": "exact transcoders (features.mlp_transcoders)"},
    "evaluate_circuit": {"embedding": "embedding='token' or 'split'"},
    "faithfulness_curve": {"embedding": "scores on embedding='token' or 'split'"},
    "features.qk_attributions": {"mlp weights": "exact transcoders (features.mlp_transcoders)"},
    "features.top_attention": {"mlp weights": "exact transcoders (features.mlp_transcoders)"},
    "edge_relevance_patching": {"readers": "qk_fix=True", "projections": "qk_fix=True", "head inputs": "qk_fix=True"},
    "relevance_patching": {"readers": "qk_fix=True", "projections": "qk_fix=True"},
}

#: Identities a helper reads as an option, with what it does where one fails (it still answers, exactly).
ADAPTS: dict[str, dict[str, str]] = {
    name: {"rows": "one pass per ablation or edge instead of several stacked along the batch",
           "start at layer": "every pass from the tokens instead of from the cached stream"}
    for name in ("head_ablation_scan", "path_patching", "scale.head_ablation_scan", "scale.path_patching", "fix_unreliable")
} | {
    name: {"rows": "the batch read in one pass (memory_budget and batch_chunk then not applied)"}
    for name in ("logit_lens", "jacobian_lens")
} | {
    name: {"rows": "the QK fix's patched copies one pass each instead of stacked along the batch",
           "scores": "the QK fix's patterns by the model's own attention instead of from the projections",
           "start at layer": "the QK fix's passes from the tokens instead of from the cached stream"}
    for name in ("edge_attribution_patching", "attribution_patching", "scale.edge_attribution_patching",
                 "scale.attribution_patching", "edge_relevance_patching", "relevance_patching")
} | {
    "fit_jacobian_lens": {name: "the blocks' backward passes by autograd instead of written out from the weights"
                          for name in ("stream", "heads", "values", "scores", "mlp reads", "mlp writes", "mlp weights")}
}

#: Public functions that take a model and rely on no identity, each with why.
EXEMPT: dict[str, str] = {
    "certify": "it measures the identities",
    "as_dtype": "a copy of the model in another dtype: the copy is certified when a helper uses it",
    "models.save_model": "writes the weights and config; nothing is computed",
    "ungroup_gqa": "a copy of the model with each KV head's weights repeated per query head (the same function, tested): "
                   "the copy is certified when a helper uses it",
    "induction_batch": "reads the vocabulary size and context length only",
    "score_model": "the model's own loss and accuracy: its logits as they are, nothing decomposed",
    "scale.metric_values": "the metric of the model's own logits, batch by batch: nothing decomposed",
    "scale.stream": "runs the analysis it is given, which certifies the model itself",
    "scale.run_method": "runs the scale helper of the registry entry's helper (scale.<helper>), which certifies the model",
    "features.estimate_graph": "reads the config's shapes only; nothing is run",
    "hooks.store_matching": "builds hooks that record activations; nothing is computed",
    "hooks.split_qkv_inputs": "routes the caller's own per-head input hooks; the caller's hooks say what they compute",
    "variables.untrained_copy": "a copy of the model with its weights drawn afresh (the DAS control): the copy is "
                                "certified when a helper uses it",
}

#: Configurations no identity can make exact for some helper: what each means (the certificate reads
#: each off the config, :data:`rs_interp.exact.certificate.CONFIGURATIONS`).
CONDITIONS: dict[str, str] = {
    "soft-capped logits": "the logits pass a soft-cap c tanh(l / c): no split of a logit over components is exact through it, "
                          "and the logits are not linear in the final stream",
    "MLPs or a norm": "the path expansion is the sum over head chains of an attention-only, norm-free model; "
                      "rs_interp.direct_logit_attribution splits such a model exactly, each norm's scale frozen",
    "not rotary": "the score of the query and key biases alone depends on the offset only under rotary positions",
    "attention-only": "there is no MLP for transcoders to replace",
    "parallel blocks": "the MLP reads the block's input, not the stream after the attention: the query/key split of "
                       "features is not built or tested for it (the feature graph and interventions are)",
    "post-norm blocks": "a head's write is z W_O times gain / s, s the scale of its whole attention's output at each token "
                        "(the norm after the sublayer): no product of weights alone is what one head passes on; and what "
                        "an MLP writes is the norm of its neurons' sum, which its neurons alone are not a transcoder of",
    "not plain ReLU MLPs": "the neurons of a gated or non-ReLU MLP are not a transcoder (train one: features.train_transcoder)",
    "bidirectional attention": "the Jacobian lens's estimator sums d h_final[t'] / d h_l[t] over t' >= t by planting each "
                               "backward pass's cotangent at every position at once, which only causal attention makes that sum",
}

#: The configurations of :data:`CONDITIONS` each helper refuses by name, before any measurement.
REFUSES: dict[str, tuple[str, ...]] = {
    "direct_logit_attribution": ("soft-capped logits",),
    "second_order_attribution": ("soft-capped logits",),
    "scale.direct_logit_attribution": ("soft-capped logits",),
    "path_expansion": ("MLPs or a norm",),
    "path_logit_attribution": ("MLPs or a norm",),
    "positional_scores": ("not rotary",),
    "composition_scores": ("post-norm blocks",),
    "virtual_weight": ("post-norm blocks",),
    "copying_scores": ("post-norm blocks",),
    "head_affinity": ("post-norm blocks",),
    "head_affinities": ("post-norm blocks",),
    "features.attribution_graph": ("attention-only", "soft-capped logits"),
    "features.intervene": ("attention-only", "soft-capped logits"),
    "features.qk_attributions": ("attention-only", "parallel blocks", "soft-capped logits"),
    "features.top_attention": ("attention-only", "parallel blocks", "soft-capped logits"),
    "features.train_transcoder": ("attention-only",),
    "features.transcoder_metrics": ("attention-only",),
    "features.train_clt": ("attention-only",),
    "features.mlp_transcoders": ("attention-only", "not plain ReLU MLPs", "post-norm blocks"),
    "fit_jacobian_lens": ("bidirectional attention",),
}
