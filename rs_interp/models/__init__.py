"""Models and their data: configs and checkpoints, the shipped models, training, the induction data,
``code-2l``, GPT-2 and pretrained Hugging Face checkpoints.

- :mod:`.checkpoints`: configs, building, dtype copies, the one checkpoint format;
- :mod:`.registry`: the shipped models (:data:`SHIPPED_MODELS`) and their retraining;
- :mod:`.training`: the training loop and scores; :mod:`.data`: the induction batches;
- :mod:`.code_model`: ``code-2l``'s corpus, tokenizer and recipe;
- :mod:`.gpt2_sizes`, :mod:`.gpt2`, :mod:`.pretrained`: GPT-2 and any Hugging Face causal LM.
"""

from typing import TYPE_CHECKING

from .._lazy import attach

#: Every public name and its module, imported on first use (rs_interp._lazy): the catalog and the
#: command line do not load torch.
_WHERE: dict[str, str] = {
    "CheckpointError": ".checkpoints",
    "as_dtype": ".checkpoints",
    "attn_only_config": ".checkpoints",
    "load_model": ".checkpoints",
    "make_attn_only": ".checkpoints",
    "save_model": ".checkpoints",
    "InductionBatch": ".data",
    "induction_batch": ".data",
    "next_token_targets": ".data",
    "GPT2WeightsUnavailable": ".gpt2",
    "load_gpt2": ".gpt2",
    "ParameterCount": ".gpt2_sizes",
    "count_parameters": ".gpt2_sizes",
    "gpt2_config": ".gpt2_sizes",
    "WeightsUnavailable": ".pretrained",
    "load_pretrained": ".pretrained",
    "SHIPPED_MODELS": ".registry",
    "ShippedModel": ".registry",
    "Trained": ".registry",
    "TrainingCache": ".registry",
    "load_toy_model": ".registry",
    "train_shipped": ".registry",
    "Score": ".training",
    "evaluate": ".training",
    "score_logits": ".training",
    "train_induction_model": ".training",
}

if TYPE_CHECKING:
    from .checkpoints import CheckpointError, as_dtype, attn_only_config, load_model, make_attn_only, save_model
    from .data import InductionBatch, induction_batch, next_token_targets
    from .gpt2 import GPT2WeightsUnavailable, load_gpt2
    from .gpt2_sizes import ParameterCount, count_parameters, gpt2_config
    from .pretrained import WeightsUnavailable, load_pretrained
    from .registry import SHIPPED_MODELS, ShippedModel, Trained, TrainingCache, load_toy_model, train_shipped
    from .training import Score, evaluate, score_logits, train_induction_model

__getattr__, __dir__ = attach(__name__, _WHERE, globals())

__all__ = [
    "CheckpointError", "as_dtype", "attn_only_config", "load_model", "make_attn_only", "save_model",
    "InductionBatch", "induction_batch", "next_token_targets",
    "GPT2WeightsUnavailable", "load_gpt2", "ParameterCount", "count_parameters", "gpt2_config",
    "WeightsUnavailable", "load_pretrained",
    "SHIPPED_MODELS", "ShippedModel", "Trained", "TrainingCache", "load_toy_model", "train_shipped",
    "Score", "evaluate", "score_logits", "train_induction_model",
]
