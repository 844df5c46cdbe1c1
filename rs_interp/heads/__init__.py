"""Head analyses: what each attention head does, scored and ablated.

- :mod:`.roles`: previous-token, induction and positional scores, attention sinks, Proposition 5;
- :mod:`.composition`: Q-, K- and V-composition scores; :mod:`.copying`: copying scores of the OV circuits;
- :mod:`.ablation`: a layer's key or query input restricted to chosen heads;
- :mod:`.head_ablation`: zero, mean and resample ablation of heads, and whole-model scans.

``rs_interp.heads.<name>`` keeps naming the head-role scores (:mod:`.roles`' public names).
"""

from .roles import (
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

__all__ = [
    "attention_patterns",
    "first_token_attention",
    "FirstTokenAttention",
    "prev_token_scores",
    "induction_scores",
    "InductionScores",
    "positional_scores",
    "key_score_sensitivity",
    "ScoreSensitivity",
    "find_prev_token_head",
]
