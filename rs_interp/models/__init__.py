"""Models and their data: configs and checkpoints, the shipped models, training, the induction data,
``code-2l``, GPT-2 and pretrained Hugging Face checkpoints.

- :mod:`.checkpoints`: configs, building, dtype copies, the one checkpoint format;
- :mod:`.registry`: the shipped models (:data:`SHIPPED_MODELS`) and their retraining;
- :mod:`.training`: the training loop and scores; :mod:`.data`: the induction batches;
- :mod:`.code_model`: ``code-2l``'s corpus, tokenizer and recipe;
- :mod:`.gpt2_config`, :mod:`.gpt2`, :mod:`.pretrained`: GPT-2 and any Hugging Face causal LM.
"""

from .checkpoints import CheckpointError, as_dtype, attn_only_config, load_model, make_attn_only, save_model
from .data import InductionBatch, induction_batch, next_token_targets
from .gpt2 import GPT2WeightsUnavailable, load_gpt2
from .gpt2_config import ParameterCount, count_parameters, gpt2_config
from .pretrained import WeightsUnavailable, load_pretrained
from .registry import SHIPPED_MODELS, ShippedModel, Trained, TrainingCache, load_toy_model, train_shipped
from .training import Score, evaluate, score_logits, train_induction_model

__all__ = [
    "CheckpointError", "as_dtype", "attn_only_config", "load_model", "make_attn_only", "save_model",
    "InductionBatch", "induction_batch", "next_token_targets",
    "GPT2WeightsUnavailable", "load_gpt2", "ParameterCount", "count_parameters", "gpt2_config",
    "WeightsUnavailable", "load_pretrained",
    "SHIPPED_MODELS", "ShippedModel", "Trained", "TrainingCache", "load_toy_model", "train_shipped",
    "Score", "evaluate", "score_logits", "train_induction_model",
]
