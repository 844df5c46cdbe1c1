"""rs_interp: the residual stream, usable and checkable, on TransformerLens.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> batch = ri.induction_batch(100, seed=1)
>>> ri.score_model(model, batch.tokens, targets=batch.targets).accuracy > 0.9
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import attach
from ._source_tree import register_hooks_of_the_source_tree

register_hooks_of_the_source_tree()  # hooks/ is rs_interp.hooks also when rs_interp runs from its clone (no install)

#: Every public name and the module that defines it. The rule (docs/getting-started.md, "What is where"): the top
#: level holds what a notebook calls to study a model -- the loaders of a model by what one has (a shipped
#: toy's name, GPT-2, any Hugging Face causal LM) and their errors, the data and metrics to run it on, the
#: everyday analysis helpers, the types a notebook builds or loads (``Model``, ``Metric``, ``Ablation``, the
#: lenses), the certificate, and the subpackages. The result types and the specialised families are
#: ``rs_interp.<role>.NAME`` (``rs_interp.circuits.EdgeEffects``, ``rs_interp.readouts.jspace_decomposition``).
#: Building, configuring, training, saving and shipping a model (the maintainer's API) is ``rs_interp.models.NAME``
#: only. Imported on first use (PEP 562): ``import rs_interp``
#: itself loads neither torch nor TransformerLens (rs_interp._lazy).
_WHERE: dict[str, str] = {
    "Model": "._backend",
    "Ablation": ".exact.validate",
    "run_with_key_input": ".heads.ablation",
    "run_with_query_input": ".heads.ablation",
    "Certificate": ".exact.certificate",
    "certify": ".exact.certificate",
    "attribution_patching": ".circuits.node_attribution",
    "edge_attribution_patching": ".circuits.edge_attribution",
    "edge_layout": ".circuits.graph",
    "path_patching": ".circuits.path_patching",
    "evaluate_circuit": ".circuits.evaluation",
    "faithfulness_curve": ".circuits.evaluation",
    "mib_scores": ".circuits.evaluation",
    "top_edges": ".circuits.selection",
    "acdc": ".circuits.acdc",
    "bootstrap": ".circuits.uncertainty",
    "stability": ".circuits.uncertainty",
    "fix_unreliable": ".circuits.correction",
    "edge_relevance_patching": ".circuits.relevance",
    "relevance_patching": ".circuits.relevance",
    "composition_scores": ".heads.composition",
    "virtual_weight": ".heads.composition",
    "head_affinity": ".heads.affinity",
    "head_affinities": ".heads.affinity",
    "copying_scores": ".heads.copying",
    "induction_batch": ".models.data",
    "next_token_targets": ".models.data",
    "attention_patterns": ".heads.roles",
    "find_prev_token_head": ".heads.roles",
    "first_token_attention": ".heads.roles",
    "induction_scores": ".heads.roles",
    "key_score_sensitivity": ".heads.roles",
    "positional_scores": ".heads.roles",
    "prev_token_scores": ".heads.roles",
    "features": ".features",
    "hooks": ".hooks",
    "tasks": ".tasks",
    "scale": ".scale",
    "models": ".models",
    "variables": ".variables",
    "gpt2_tokenizer": ".tokenizers",
    "head_label": ".labels",
    "head_labels": ".labels",
    "Metric": ".metrics",
    "next_token_loss": ".metrics",
    "ablate_heads": ".heads.head_ablation",
    "head_ablation_scan": ".heads.head_ablation",
    "GPT2WeightsUnavailable": ".models.gpt2",
    "load_gpt2": ".models.gpt2",
    "WeightsUnavailable": ".models.pretrained",
    "load_pretrained": ".models.pretrained",
    "FileError": "._files",
    "logit_lens": ".readouts.lens",
    "TunedLens": ".readouts.tuned_lens",
    "lens_kl": ".readouts.tuned_lens",
    "train_tuned_lens": ".readouts.tuned_lens",
    "JacobianLens": ".readouts.jacobian_lens",
    "fit_jacobian_lens": ".readouts.jacobian_fit",
    "jacobian_lens": ".readouts.jacobian_readout",
    "count_parameters": ".models.gpt2_sizes",
    "as_dtype": ".models.checkpoints",
    "load_toy_model": ".models.registry",
    "direct_logit_attribution": ".readouts.attribution",
    "path_expansion": ".readouts.paths",
    "path_logit_attribution": ".readouts.paths",
    "second_order_attribution": ".readouts.second_order",
    "score_model": ".models.training",
    "score_logits": ".models.training",
}

if TYPE_CHECKING:  # the names, for type checkers and the documentation (which reads these imports)
    from . import features, hooks, models, scale, tasks, variables
    from ._backend import Model
    from ._files import FileError
    from .circuits.acdc import acdc
    from .circuits.correction import fix_unreliable
    from .circuits.edge_attribution import edge_attribution_patching
    from .circuits.evaluation import evaluate_circuit, faithfulness_curve, mib_scores
    from .circuits.graph import edge_layout
    from .circuits.node_attribution import attribution_patching
    from .circuits.path_patching import path_patching
    from .circuits.relevance import edge_relevance_patching, relevance_patching
    from .circuits.selection import top_edges
    from .circuits.uncertainty import bootstrap, stability
    from .exact.certificate import Certificate, certify
    from .exact.validate import Ablation
    from .heads.ablation import run_with_key_input, run_with_query_input
    from .heads.affinity import head_affinities, head_affinity
    from .heads.composition import composition_scores, virtual_weight
    from .heads.copying import copying_scores
    from .heads.head_ablation import ablate_heads, head_ablation_scan
    from .heads.roles import (
        attention_patterns,
        find_prev_token_head,
        first_token_attention,
        induction_scores,
        key_score_sensitivity,
        positional_scores,
        prev_token_scores,
    )
    from .labels import head_label, head_labels
    from .metrics import Metric, next_token_loss
    from .models.checkpoints import as_dtype
    from .models.data import induction_batch, next_token_targets
    from .models.gpt2 import GPT2WeightsUnavailable, load_gpt2
    from .models.gpt2_sizes import count_parameters
    from .models.pretrained import WeightsUnavailable, load_pretrained
    from .models.registry import load_toy_model
    from .models.training import score_logits, score_model
    from .readouts.attribution import direct_logit_attribution
    from .readouts.jacobian_fit import fit_jacobian_lens
    from .readouts.jacobian_lens import JacobianLens
    from .readouts.jacobian_readout import jacobian_lens
    from .readouts.lens import logit_lens
    from .readouts.paths import path_expansion, path_logit_attribution
    from .readouts.second_order import second_order_attribution
    from .readouts.tuned_lens import TunedLens, lens_kl, train_tuned_lens
    from .tokenizers import gpt2_tokenizer


#: The modules issue 51 moved into role packages, under their old names, so ``from rs_interp import plots``
#: (or ``ri.lens``) in a notebook still gives the module. (the statement ``import rs_interp.<old name>`` does not: it
#: needs the file; use the new path, e.g. ``import rs_interp.ui.plots``.)
_MOVED = {
    **{m: f".readouts.{m}" for m in ("attribution", "second_order", "paths", "lens", "tuned_lens")},
    **{m: f".heads.{m}" for m in ("composition", "copying", "ablation", "head_ablation")},
    **{m: f".ui.{m}" for m in ("plots", "circuit_figure", "cli", "circuit_command")},
    "geometry": ".reproduce.geometry", "finance": ".reproduce.finance",  # study code, with the reproduction (issue 65)
}

#: Names that left the top level in issue 65 (at most 70 names there): the result types, which a notebook holds but
#: seldom names, and the specialised families (the Jacobian lens's interventions and J-space, GQA's ungrouping), each
#: under its role package; the old spelling answers for a release with a DeprecationWarning naming the new one.
_DEMOTED: dict[str, tuple[str, ...]] = {
    "readouts": ("DirectLogitAttribution", "PathAttribution", "PathExpansion", "SecondOrderAttribution",
                 "LogitLensReadings", "JacobianLensReadings", "lens_vectors", "lens_steering_hooks",
                 "lens_ablation_hooks", "lens_swap_hooks", "JSpaceDecomposition", "jspace_decomposition",
                 "JSpaceOccupancy", "jspace_occupancy", "JSpaceVariance", "jspace_variance", "CoordinatePatch",
                 "coordinate_patch", "coordinate_patch_hooks"),
    "heads": ("CompositionScores", "HeadAffinity", "HeadAblationScan", "FirstTokenAttention", "InductionScores",
              "ScoreSensitivity"),
    "circuits": ("AttributionPatching", "EdgeAttributionPatching", "EdgeEffects", "EdgeLayout", "PathPatching",
                 "FaithfulnessCurve", "MIBScores", "ACDC", "Bootstrap", "Stability", "Fixed", "EdgeRelevancePatching",
                 "RelevancePatching", "PositionSchema", "PositionalEdgeEffects", "ungroup_gqa"),
    "models": ("InductionBatch", "Score", "ParameterCount"),
}

#: Names that left the top level in issue 51, kept for a release: each gives the object at its new place
#: with a warning naming it, and is in neither ``__all__`` nor ``dir()`` (rs_interp._lazy). The maintainer's
#: API (building, configuring, training, saving, shipping) moved to ``rs_interp.models``: a
#: DeprecationWarning, shown where a script or notebook uses the name itself. ``evaluate`` (a notebook's
#: call, renamed: beside ``evaluate_circuit`` it said neither what it computes nor of what): a FutureWarning,
#: shown to every user.
_DEPRECATED: dict[str, tuple[str, type[Warning]]] = {
    **{name: (f"rs_interp.models.{name}", DeprecationWarning) for name in (
        "Trained", "TrainingCache", "train_shipped", "SHIPPED_MODELS", "ShippedModel", "train_induction_model",
        "make_attn_only", "attn_only_config", "gpt2_config", "save_model", "load_model", "CheckpointError")},
    "evaluate": ("rs_interp.score_model", FutureWarning),
    **{name: (f"rs_interp.{package}.{name}", DeprecationWarning)
       for package, names in _DEMOTED.items() for name in names},
}

__getattr__, __dir__ = attach(__name__, _WHERE, globals(), moved=_MOVED, deprecated=_DEPRECATED)


__all__ = [
    # a model: loaded by what one has (building, training, saving, shipping one: rs_interp.models)
    "Model",
    "load_toy_model",
    "load_gpt2",
    "load_pretrained",
    "WeightsUnavailable",
    "GPT2WeightsUnavailable",
    "FileError",
    "as_dtype",
    "count_parameters",
    # its data, labels and metrics
    "induction_batch",
    "next_token_targets",
    "head_label",
    "head_labels",
    "Metric",
    "next_token_loss",
    # scoring a model on next-token targets
    "score_model",
    "score_logits",
    # heads
    "composition_scores",
    "virtual_weight",
    "head_affinity",
    "head_affinities",
    "run_with_key_input",
    "run_with_query_input",
    "ablate_heads",
    "Ablation",
    "head_ablation_scan",
    "copying_scores",
    "attention_patterns",
    "prev_token_scores",
    "find_prev_token_head",
    "induction_scores",
    "positional_scores",
    "key_score_sensitivity",
    "first_token_attention",
    # circuits
    "attribution_patching",
    "edge_attribution_patching",
    "edge_layout",
    "path_patching",
    "evaluate_circuit",
    "faithfulness_curve",
    "mib_scores",
    "top_edges",
    "fix_unreliable",
    "bootstrap",
    "stability",
    "acdc",
    "edge_relevance_patching",
    "relevance_patching",
    # paths and lens
    "path_expansion",
    "path_logit_attribution",
    "direct_logit_attribution",
    "second_order_attribution",
    "logit_lens",
    "train_tuned_lens",
    "TunedLens",
    "lens_kl",
    "fit_jacobian_lens",
    "JacobianLens",
    "jacobian_lens",
    # what holds on a model
    "certify",
    "Certificate",
    # tasks and GPT-2's tokenizer
    "tasks",
    # datasets, resuming, several processes
    "scale",
    # feature circuits
    "features",
    # causal variables: interchange interventions, DAS, causal models and pair sets
    "variables",
    "gpt2_tokenizer",
    # hook factories
    "hooks",
    # the maintainer's API: building, configuring, training, saving and shipping models
    "models",
]
