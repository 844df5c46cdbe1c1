"""circuit-tracer's graph-level conventions as options of :func:`rs_interp.features.attribution_graph` (private).

What circuit-tracer (decoderesearch/circuit-tracer, 0.4.1) does that changes the graph rather than its file,
each read from its source:

- **zero_positions** (``ReplacementModel._configure_replacement_model``: ``slice(0, 4)`` for a Gemma-3 ``-it``
  model, ``slice(0, 1)`` otherwise): ``encode_sparse`` sets the activations there to 0 (no feature node there,
  and none of their writes in the reconstruction) and ``setup_attribution`` sets the error vectors there to 0.
  The forward pass is unchanged, so what those positions' MLP outputs hold (features, error, ``b_dec``) is a
  constant of the replacement model, credited to no node: here it joins each row's ``bias``.
- **BOS** (``ensure_tokenized``): unless the first id is one of the tokenizer's special ids, it prepends the
  first of ``bos_token_id``, ``pad_token_id``, ``eos_token_id``, ``all_special_ids`` that is set (its
  ``filter(None, ...)`` also passes over an id 0, which is taken here); a Gemma-3 ``-it`` prompt must start
  with ``<bos><start_of_turn>user\\n`` (ids 2, 105, 2364, 107) and gets nothing prepended.
- **Feature order under a cap** (``_run_attribution``): the kept features are chosen in rounds of
  ``update_interval * batch_size`` (4 x 512), each round the most influential not yet chosen on the rows
  computed so far; the graph lists them in their active order (``torch.where(visited)``: layer, position, index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

__all__: list[str] = []

#: Whose defaults :func:`rs_interp.features.attribution_graph` takes for the options left at ``None``.
GraphConvention = Literal["rs_interp", "circuit-tracer"]
FeatureOrder = Literal["selection", "index"]

#: circuit-tracer's round: ``update_interval`` (4) x ``batch_size`` (512), its ``attribute`` defaults.
CIRCUIT_TRACER_ROUND = 4 * 512
#: ``<bos><start_of_turn>user\n`` in Gemma-3's vocabulary: the prefix circuit-tracer requires of a Gemma-3 -it prompt.
GEMMA3_IT_PREFIX = (2, 105, 2364, 107)


@dataclass(frozen=True)
class Options:
    """The resolved options: the prompt attributed, the positions zeroed, the BOS prepended (or None),
    the feature order and the round size (None: rs_interp's rounds)."""

    tokens: torch.Tensor
    zero: tuple[int, ...]
    bos: int | None
    feature_order: FeatureOrder
    round_size: int | None


def is_gemma3_it(model) -> bool:
    """circuit-tracer's test: ``"gemma-3" in model_name and model_name.endswith("-it")``."""
    name = str(getattr(model.cfg, "model_name", "") or "")
    return "gemma-3" in name and name.endswith("-it")


def _bos(model, tokens: torch.Tensor, prepend_bos, gemma_it: bool) -> tuple[torch.Tensor, int | None]:
    if prepend_bos is False:
        return tokens, None
    if gemma_it and prepend_bos is True:
        if len(tokens) < 4 or tuple(tokens[:4].tolist()) != GEMMA3_IT_PREFIX:
            raise ValueError(f"prepend_bos: a Gemma-3 -it prompt must start with <bos><start_of_turn>user\\n "
                             f"{list(GEMMA3_IT_PREFIX)} (circuit-tracer's ensure_tokenized), got {tokens[:4].tolist()}")
        return tokens, None
    tok = getattr(model, "tokenizer", None)
    special = list(getattr(tok, "all_special_ids", None) or [])
    if prepend_bos is True:
        candidates = [getattr(tok, a, None) for a in ("bos_token_id", "pad_token_id", "eos_token_id")] + special
        bos = next((int(c) for c in candidates if c is not None), None)
        if bos is None:
            raise ValueError("prepend_bos=True takes the BOS from the model's tokenizer, and "
                             f"{'the model has none' if tok is None else 'it has no special token'}: "
                             "give its id, prepend_bos=<id>")
    else:
        bos = int(prepend_bos)
    if not 0 <= bos < model.cfg.d_vocab:
        raise ValueError(f"prepend_bos: the BOS id {bos} is not in the vocabulary [0, {model.cfg.d_vocab})")
    if int(tokens[0]) in {*special, bos}:  # already a special token first: nothing prepended
        return tokens, None
    return torch.cat([torch.tensor([bos], dtype=tokens.dtype), tokens]), bos


def _zero(zero_positions, n_pos: int) -> tuple[int, ...]:
    if zero_positions is None:
        return ()
    if isinstance(zero_positions, slice):
        return tuple(range(n_pos)[zero_positions])
    if isinstance(zero_positions, int):
        zero_positions = [zero_positions]
    out = sorted({int(p) for p in zero_positions})
    if out and not (-n_pos <= out[0] and out[-1] < n_pos):
        raise ValueError(f"zero_positions must be positions of the prompt in [{-n_pos}, {n_pos - 1}], got {out}")
    return tuple(sorted({p % n_pos for p in out}))


def resolve(model, tokens: torch.Tensor, convention: str, zero_positions, prepend_bos, feature_order,
            round_size) -> Options:
    """The options of a graph: each left at ``None`` takes ``convention``'s default (module docstring).

    Raises:
        ValueError: an unknown convention or feature order, a round size below 1, positions outside the prompt,
            a BOS that cannot be found or is out of the vocabulary, a Gemma-3 -it prompt without its prefix.
    """
    if convention not in ("rs_interp", "circuit-tracer"):
        raise ValueError(f"convention must be 'rs_interp' or 'circuit-tracer', got {convention!r}")
    ct = convention == "circuit-tracer"
    gemma_it = ct and is_gemma3_it(model)
    if prepend_bos is None:
        prepend_bos = ct
    if zero_positions is None and ct:
        zero_positions = slice(0, 4) if gemma_it else slice(0, 1)
    feature_order = feature_order or ("index" if ct else "selection")
    if feature_order not in ("selection", "index"):
        raise ValueError(f"feature_order must be 'selection' or 'index', got {feature_order!r}")
    if round_size is None and ct:
        round_size = CIRCUIT_TRACER_ROUND
    if round_size is not None and int(round_size) < 1:
        raise ValueError(f"round_size must be >= 1, got {round_size}")
    tokens, bos = _bos(model, tokens, prepend_bos, gemma_it)
    return Options(tokens, _zero(zero_positions, len(tokens)), bos, feature_order,
                   None if round_size is None else int(round_size))


def frozen_outputs(tcs, clean, zero: Sequence[int]):
    """``outputs(l, xs)`` of the frozen run with every node off: each MLP writes its transcoder's ``b_dec`` and
    the skips into it (from ``xs``, this run's inputs), and at the zeroed positions what the clean run's MLP output
    held beyond its skips (the zeroed features' writes, the error and ``b_dec``: constants of the replacement model,
    credited to no node)."""
    if not zero:
        return lambda l, xs: tcs[l].b_dec + tcs.skip_into(l, xs)
    idx = torch.tensor(list(zero), dtype=torch.long)

    def outputs(l: int, xs: list[torch.Tensor]) -> torch.Tensor:
        out = torch.zeros_like(xs[l]) + tcs[l].b_dec + tcs.skip_into(l, xs)
        at = lambda inputs: {i: x[idx] for i, x in enumerate(inputs[: l + 1])}  # noqa: E731
        out[idx] = clean.outputs[l][idx].to(out.dtype) - tcs.skip_into(l, at(clean.inputs)) + tcs.skip_into(l, at(xs))
        return out

    return outputs
