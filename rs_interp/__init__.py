"""rs_interp: the residual stream, usable and checkable, on TransformerLens.

>>> import rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> batch = ri.induction_batch(100, seed=1)
>>> ri.evaluate(model, batch.tokens, targets=batch.targets).accuracy > 0.9
True
"""

import warnings as _warnings

with _warnings.catch_warnings():
    # TransformerLens imports huggingface_hub, which imports tqdm.auto: in a Jupyter kernel without ipywidgets
    # that warns "IProgress not found" at import, before any bar is asked for. Imported here once, quietly
    # (rs_interp's own bars pick the text bar where there are no widgets: rs_interp._progress).
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto  # noqa: F401

from ._backend import Model
from ._validate import Ablation
from .ablation import run_with_key_input, run_with_query_input
from .certificate import Certificate, certify
from .circuits.node_attribution import AttributionPatching, attribution_patching
from .circuits.edge_attribution import EdgeAttributionPatching, edge_attribution_patching
from .circuits.graph import EdgeEffects, EdgeLayout, edge_layout
from .circuits.path_patching import PathPatching, path_patching
from .circuits.evaluation import FaithfulnessCurve, MIBScores, evaluate_circuit, faithfulness_curve, mib_scores
from .circuits.selection import top_edges
from .composition import CompositionScores, composition_scores, virtual_weight
from .copying import copying_scores
from .models.data import InductionBatch, induction_batch, next_token_targets
from .heads import (
    FirstTokenAttention,
    InductionScores,
    ScoreSensitivity,
    attention_patterns,
    find_prev_token_head,
    first_token_attention,
    induction_scores,
    key_score_sensitivity,
    positional_scores,
    prev_token_scores,
)
from ._source_tree import load_hooks_from_the_source_tree

load_hooks_from_the_source_tree()  # hooks/ is rs_interp.hooks also when rs_interp runs from its clone (no install)

from . import features, hooks, tasks  # noqa: E402
from .tokenizers import gpt2_tokenizer
from .labels import head_label, head_labels
from .metrics import Metric, next_token_loss
from .head_ablation import HeadAblationScan, ablate_heads, head_ablation_scan
from .models.gpt2 import GPT2WeightsUnavailable, load_gpt2
from .models.pretrained import WeightsUnavailable, load_pretrained
from .lens import LogitLensReadings, logit_lens
from .tuned_lens import TunedLens, lens_kl, train_tuned_lens
from .models.gpt2_config import ParameterCount, count_parameters, gpt2_config
from .models.checkpoints import (
    CheckpointError,
    as_dtype,
    attn_only_config,
    load_model,
    make_attn_only,
    save_model,
)
from .models.registry import SHIPPED_MODELS, ShippedModel, Trained, TrainingCache, load_toy_model, train_shipped
from .attribution import DirectLogitAttribution, direct_logit_attribution
from .path_expansion import PathAttribution, PathExpansion, path_expansion, path_logit_attribution
from .second_order import SecondOrderAttribution, second_order_attribution
from .models.training import Score, evaluate, score_logits, train_induction_model

Model = Model
"""The model every helper takes: ``HookedTransformer`` under TransformerLens 3.x, ``TransformerBridge``
(in compatibility mode) under 4.x; :func:`rs_interp.load_toy_model`, :func:`rs_interp.load_gpt2` and
:func:`rs_interp.load_pretrained` return it.

>>> import rs_interp as ri
>>> isinstance(ri.load_toy_model("induction-2l"), ri.Model)
True
"""

__all__ = [
    # models and data
    "Model",
    "ShippedModel",
    "Trained",
    "attn_only_config",
    "make_attn_only",
    "as_dtype",
    "save_model",
    "load_model",
    "load_toy_model",
    "SHIPPED_MODELS",
    "train_shipped",
    "TrainingCache",
    "CheckpointError",
    "InductionBatch",
    "induction_batch",
    "next_token_targets",
    "head_label",
    "head_labels",
    "Metric",
    "next_token_loss",
    # training
    "train_induction_model",
    "evaluate",
    "score_logits",
    "Score",
    # circuits
    "composition_scores",
    "CompositionScores",
    "virtual_weight",
    "run_with_key_input",
    "run_with_query_input",
    "ablate_heads",
    "Ablation",
    "head_ablation_scan",
    "HeadAblationScan",
    "copying_scores",
    "attribution_patching",
    "AttributionPatching",
    "edge_attribution_patching",
    "EdgeAttributionPatching",
    "edge_layout",
    "EdgeLayout",
    "EdgeEffects",
    "path_patching",
    "PathPatching",
    "evaluate_circuit",
    "faithfulness_curve",
    "FaithfulnessCurve",
    "mib_scores",
    "MIBScores",
    "top_edges",
    "attention_patterns",
    "prev_token_scores",
    "find_prev_token_head",
    "induction_scores",
    "InductionScores",
    "positional_scores",
    "key_score_sensitivity",
    "first_token_attention",
    "FirstTokenAttention",
    "ScoreSensitivity",
    # paths and lens
    "path_expansion",
    "PathExpansion",
    "path_logit_attribution",
    "PathAttribution",
    "direct_logit_attribution",
    "DirectLogitAttribution",
    "second_order_attribution",
    "SecondOrderAttribution",
    "logit_lens",
    "LogitLensReadings",
    "train_tuned_lens",
    "TunedLens",
    "lens_kl",
    # GPT-2
    "gpt2_config",
    "load_gpt2",
    "load_pretrained",
    "WeightsUnavailable",
    "GPT2WeightsUnavailable",
    "count_parameters",
    "ParameterCount",
    # what holds on a model
    "certify",
    "Certificate",
    # tasks and GPT-2's tokenizer
    "tasks",
    # feature circuits
    "features",
    "gpt2_tokenizer",
    # hook factories
    "hooks",
]
