"""Loading GPT-2 into TransformerLens: from the hub, from a local checkpoint, or at random.

Sources:

- ``"hub"``: ``HookedTransformer.from_pretrained`` (honours the Hugging Face cache and
  ``HF_HUB_OFFLINE``);
- a path to a local Hugging Face GPT-2 checkpoint directory (``config.json`` plus
  ``model.safetensors``): converted offline with TransformerLens's own weight conversion, no
  network call;
- ``"random"``: random initialisation of the same shape, for structure-only work.

``RS_INTERP_GPT2_PATH`` names a local checkpoint directory for :func:`find_pretrained_gpt2`.

>>> model = load_gpt2("random", size="small")   # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformer_lens import HookedTransformer

from .models import build_model
from .params import _HF_NAMES, GPT2_SIZES, gpt2_config

__all__ = ["load_gpt2", "GPT2WeightsUnavailable", "find_pretrained_gpt2", "ENV_VAR", "analyse_gpt2", "GPT2Analysis"]

ENV_VAR = "RS_INTERP_GPT2_PATH"

_HOW = (
    "GPT-2 weights can come from: source='hub' (needs network access or a Hugging Face cache that "
    "already holds 'gpt2'), a local Hugging Face checkpoint directory with config.json and "
    "model.safetensors (e.g. GPT2LMHeadModel.from_pretrained('gpt2').save_pretrained(DIR) on a machine "
    f"with access; then pass DIR or set {ENV_VAR}=DIR), or source='random' for random weights."
)


class GPT2WeightsUnavailable(RuntimeError):
    """Pretrained GPT-2 weights could not be had from the requested source."""


def _from_local(path: Path, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool, dtype: torch.dtype) -> HookedTransformer:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    if not (path / "config.json").is_file():
        raise GPT2WeightsUnavailable(f"{path} is not a Hugging Face checkpoint directory (no config.json). {_HOW}")
    hf_cfg = GPT2Config.from_pretrained(str(path), local_files_only=True)
    if hf_cfg.n_embd % hf_cfg.n_head:
        raise GPT2WeightsUnavailable(f"{path}: n_embd {hf_cfg.n_embd} is not a multiple of n_head {hf_cfg.n_head}")
    cfg = gpt2_config(
        "small", model_name=path.name, n_layers=hf_cfg.n_layer, d_model=hf_cfg.n_embd, n_heads=hf_cfg.n_head,
        d_head=hf_cfg.n_embd // hf_cfg.n_head, d_mlp=hf_cfg.n_inner or 4 * hf_cfg.n_embd, d_vocab=hf_cfg.vocab_size,
        n_ctx=hf_cfg.n_positions, eps=hf_cfg.layer_norm_epsilon, act_fn=hf_cfg.activation_function, dtype=dtype,
    )
    try:
        hf_model = GPT2LMHeadModel.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise GPT2WeightsUnavailable(f"could not read the weights in {path}: {err}. {_HOW}") from err
    state = convert_gpt2_weights(hf_model, cfg)
    model = build_model(cfg)
    model.load_and_process_state_dict(state, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                      center_unembed=center_unembed)
    has_tokenizer_files = any((path / f).is_file() for f in ("tokenizer.json", "vocab.json"))
    if has_tokenizer_files:  # without them transformers builds an empty tokenizer; token ids still work
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        if len(tokenizer) >= cfg.d_vocab - 1:
            model.set_tokenizer(tokenizer)
    return model.eval()


def load_gpt2(
    source: str | os.PathLike = "hub",
    *,
    size: str = "small",
    fold_ln: bool = True,
    center_writing_weights: bool | None = None,
    center_unembed: bool | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> HookedTransformer:
    """Load GPT-2 as a ``HookedTransformer`` (see the module docstring for sources).

    Args:
        source: ``"hub"``, ``"random"`` or a local checkpoint directory.
        size: ``"small"``, ``"medium"``, ``"large"`` or ``"xl"`` (hub and random).
        fold_ln: fold LayerNorm gains and biases into the next weights (exact; the stream's
            LayerNorms become ``LNPre``). ``False`` keeps LayerNorm explicit.
        center_writing_weights, center_unembed: TransformerLens's processing; default: ``fold_ln``.
        dtype: parameter dtype.
        seed: seed of the ``"random"`` initialisation.

    Raises:
        GPT2WeightsUnavailable: the weights cannot be had; the message says which sources exist
            and how to provide one.
    """
    cww = fold_ln if center_writing_weights is None else center_writing_weights
    cu = fold_ln if center_unembed is None else center_unembed
    if size not in GPT2_SIZES:
        raise ValueError(f"size must be one of {sorted(GPT2_SIZES)}, got {size!r}")
    if source == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_model(gpt2_config(size, dtype=dtype))
        return model.eval()
    if source == "hub":
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="HookedTransformer", category=DeprecationWarning)
                model = HookedTransformer.from_pretrained(
                    _HF_NAMES[size], fold_ln=fold_ln, center_writing_weights=cww, center_unembed=cu, dtype=dtype, device="cpu")
        except Exception as err:  # network, cache and hub errors come in many types
            raise GPT2WeightsUnavailable(f"could not load {_HF_NAMES[size]!r} from the Hugging Face hub or cache ({type(err).__name__}: {str(err)[:200]}). {_HOW}") from err
        return model.eval()
    path = Path(source)
    if not path.exists():
        raise GPT2WeightsUnavailable(f"source {str(source)!r} is neither 'hub', 'random' nor an existing directory. {_HOW}")
    return _from_local(path, fold_ln=fold_ln, center_writing_weights=cww, center_unembed=cu, dtype=dtype)


def find_pretrained_gpt2(*, fold_ln: bool = True) -> tuple[HookedTransformer | None, str]:
    """Pretrained GPT-2 small if it is here, without waiting on the network.

    Tries ``$RS_INTERP_GPT2_PATH``, then the Hugging Face cache (looked up on disk first, so a
    machine with no network and no cache answers at once). Returns ``(model, description)`` or ``(None, reason)``.
    """
    path = os.environ.get(ENV_VAR)
    if path:
        try:
            return load_gpt2(path, fold_ln=fold_ln), f"pretrained weights from {path}"
        except GPT2WeightsUnavailable as err:
            return None, str(err)
    if not _in_hf_cache(_HF_NAMES["small"]):
        return None, f"no pretrained GPT-2 weights here: {ENV_VAR} is unset and the Hugging Face cache has no 'gpt2'. {_HOW}"
    try:
        return load_gpt2("hub", fold_ln=fold_ln), "pretrained weights from the Hugging Face cache"
    except GPT2WeightsUnavailable as err:
        return None, str(err)


def _in_hf_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds ``repo_id``'s config and weights (no network call)."""
    from huggingface_hub import try_to_load_from_cache

    have = lambda f: isinstance(try_to_load_from_cache(repo_id, f), str)  # noqa: E731
    return have("config.json") and (have("model.safetensors") or have("pytorch_model.bin"))


@dataclass(frozen=True)
class GPT2Analysis:
    """What ``rs-interp gpt2`` reports for one model.

    Attributes:
        weights: ``"pretrained"`` or ``"random"`` (and where they came from, in ``source``).
        prev_token: (layer, head) previous-token scores on repeated random tokens.
        induction: (layer, head) induction scores (weight on the induction target).
        top_prev_token, top_induction: the ten best heads of each, as ``"L.H"`` labels, best first.
        prompt: the logit-lens prompt (None without a tokenizer).
        prompt_answer: the token whose probability is tracked (e.g. ``" Paris"``).
        lens_labels, lens_p_answer: the logit-lens curve of P(answer) at the prompt's last position.
        final_top_token: the model's top prediction for the prompt.
    """

    weights: str
    source: str
    prev_token: torch.Tensor
    induction: torch.Tensor
    top_prev_token: tuple[str, ...]
    top_induction: tuple[str, ...]
    prompt: str | None = None
    prompt_answer: str | None = None
    lens_labels: tuple[str, ...] = ()
    lens_p_answer: tuple[float, ...] = ()
    final_top_token: str | None = None


def _top_heads(scores: torch.Tensor, k: int = 10) -> tuple[str, ...]:
    H = scores.shape[1]
    order = scores.flatten().argsort(descending=True)[:k]
    return tuple(f"{int(i) // H}.{int(i) % H}" for i in order)


def analyse_gpt2(
    model: HookedTransformer,
    *,
    weights: str,
    source: str = "",
    prompt: str = "The Eiffel Tower is in the city of",
    answer: str = " Paris",
    seed: int = 0,
    n_sequences: int = 8,
    period: int = 50,
) -> GPT2Analysis:
    """Head roles on repeated random tokens, and the logit lens on a factual prompt.

    Repeated random tokens: ``n_sequences`` blocks of ``period`` random tokens, each shown twice.
    The logit lens runs only when the model has a tokenizer.
    """
    from .data import induction_batch
    from .heads import induction_scores, prev_token_scores
    from .lens import logit_lens

    batch = induction_batch(n_sequences, seed=seed, d_vocab=model.cfg.d_vocab, seq_len=2 * period,
                            min_period=period, max_period=period)
    prev = prev_token_scores(model, batch.tokens)
    ind = induction_scores(model, batch).target
    out = dict(weights=weights, source=source, prev_token=prev, induction=ind,
               top_prev_token=_top_heads(prev), top_induction=_top_heads(ind))
    answer_ids = model.to_tokens(answer, prepend_bos=False)[0] if model.tokenizer is not None else None
    if answer_ids is not None and answer_ids.numel() != 1:
        raise ValueError(f"answer must be a single token for this tokenizer, got {answer!r} -> {answer_ids.tolist()}")
    if model.tokenizer is not None:
        tokens = model.to_tokens(prompt)
        answer_id = int(answer_ids[0])
        targets = torch.full_like(tokens, -1)
        targets[0, -1] = answer_id
        lens = logit_lens(model, tokens, targets=targets, top_k=1)
        out.update(prompt=prompt, prompt_answer=answer, lens_labels=lens.labels,
                   lens_p_answer=tuple(float(p) for p in lens.target_probs[:, 0, -1]),
                   final_top_token=model.tokenizer.decode([int(lens.top_tokens[-1, 0, -1, 0])]))
    return GPT2Analysis(**out)


def conversion_check(*, seed: int = 0, n_tokens: int = 32) -> float:
    """Max |difference| of centered logits between a random ``GPT2LMHeadModel(GPT2Config())`` and
    the same weights loaded through :func:`load_gpt2` from a temporary checkpoint directory.

    Exercises the whole offline loading path (safetensors, config, TransformerLens's conversion
    and LayerNorm folding) on weights that need no download.
    """
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = GPT2LMHeadModel(GPT2Config()).eval()
        tokens = torch.randint(0, hf.config.vocab_size, (2, n_tokens))
    with tempfile.TemporaryDirectory(prefix="rs_interp_gpt2_") as d:
        hf.save_pretrained(d)
        model = load_gpt2(d)
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    center = lambda x: x - x.mean(-1, keepdim=True)  # noqa: E731
    return float((center(ours) - center(theirs)).abs().max())
