"""Models and their data: configs and checkpoints, the shipped models, training, the induction data,
``code-2l``, GPT-2 and pretrained Hugging Face checkpoints.

The maintainer's API lives here: building, configuring, training, saving and shipping a model
(:func:`make_attn_only`, :func:`attn_only_config`, :func:`gpt2_config`, :func:`train_induction_model`,
:func:`train_shipped`, :class:`TrainingCache`, :data:`SHIPPED_MODELS`, :func:`save_model` /
:func:`load_model`). What a notebook calls to load and score a model (:func:`load_toy_model`,
:func:`load_gpt2`, :func:`load_pretrained`, :func:`score_model`, ...) is also ``rs_interp.NAME``.

>>> from rs_interp.models import SHIPPED_MODELS, make_attn_only
>>> sorted(SHIPPED_MODELS)[:3], make_attn_only(1).cfg.n_layers
(['code-2l', 'induction-1l', 'induction-2l'], 1)

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
    "score_model": ".training",
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
    from .training import Score, score_logits, score_model, train_induction_model

#: Old names kept for a release (rs_interp._lazy): each warns and names its new place.
_DEPRECATED = {"evaluate": ("rs_interp.models.score_model", FutureWarning)}

__getattr__, __dir__ = attach(__name__, _WHERE, globals(), deprecated=_DEPRECATED)

__all__ = [
    "CheckpointError", "as_dtype", "attn_only_config", "load_model", "make_attn_only", "save_model",
    "InductionBatch", "induction_batch", "next_token_targets",
    "GPT2WeightsUnavailable", "load_gpt2", "ParameterCount", "count_parameters", "gpt2_config",
    "WeightsUnavailable", "load_pretrained",
    "SHIPPED_MODELS", "ShippedModel", "Trained", "TrainingCache", "load_toy_model", "train_shipped",
    "Score", "score_model", "score_logits", "train_induction_model",
]
