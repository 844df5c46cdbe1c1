"""A loaded model against its source: the Hugging Face model's log-probabilities on a probe batch,
compared with the converted model's, and the refusals of a load that cannot be had.

TransformerLens converts a checkpoint's weights into its own modules (3.x) or boots the Hugging Face
modules and processes their weights (4.x); either can silently compute another function (3.9 drops a
Llama checkpoint's ``attention_bias`` and ``mlp_bias``). :func:`reference` runs the Hugging Face model
first (then frees it: the peak is one model, not two) and :func:`compare` refuses a converted model
whose log-probabilities are not the source's.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import _backend
from .._backend import Model
from ..certificate import note_source

__all__: list[str] = []

#: The largest log-probability difference accepted between a loaded model and its source, by dtype:
#: float64 leaves room for the steps Hugging Face computes in float32 whatever the dtype (measured
#: up to 1.7e-6 on the tested families), float32 for TransformerLens's folding and centring.
SOURCE_TOLERANCE = {torch.float64: 1e-4, torch.float32: 1e-2, torch.float16: 0.25, torch.bfloat16: 0.25}

#: Config flags that add parameters some conversions leave out: named when a conversion misses.
_BIAS_FLAGS = ("attention_bias", "mlp_bias", "qkv_bias", "use_bias", "bias", "add_bias_linear", "use_qkv_bias")


@dataclass(frozen=True)
class Reference:
    """The source's log-probabilities on the probe batch."""

    architecture: str
    tokens: torch.Tensor
    log_probs: torch.Tensor
    flags: tuple[str, ...]


def architecture(config: dict) -> str:
    return (config.get("architectures") or [config.get("model_type", "an unknown architecture")])[0]


def reference(source: str, dtype: torch.dtype, *, local: bool) -> Reference:
    """The Hugging Face model's log-probabilities on a probe batch (2 x 8 random token ids), the model
    freed after.

    Raises:
        ValueError: transformers cannot run this family in ``dtype`` (named, with the dtype to use).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json.loads((Path(source) / "config.json").read_text()) if local else AutoConfig.from_pretrained(source).to_dict()
    arch = architecture(config)
    flags = tuple(f for f in _BIAS_FLAGS if config.get(f))
    hf = AutoModelForCausalLM.from_pretrained(source, local_files_only=local, dtype=dtype).eval()
    vocab = min(int(config.get("vocab_size") or hf.config.vocab_size), hf.get_input_embeddings().num_embeddings)
    n_ctx = int(config.get("max_position_embeddings") or config.get("n_positions") or config.get("seq_length") or 8)
    tokens = torch.randint(0, vocab, (2, min(8, n_ctx)), generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            log_probs = hf(tokens).logits.to(torch.float64).log_softmax(-1)
    except Exception as err:
        dtype_error = any(w in str(err) for w in ("Float", "Double", "dtype", "Half", "BFloat16"))
        hint = ("load it with dtype=torch.float32" if dtype_error else
                "the checkpoint or transformers' implementation of this family does not run, so there is nothing to convert")
        raise ValueError(f"transformers' own {arch} fails on a probe batch in {dtype} ({type(err).__name__}: "
                         f"{str(err)[:160]}): {hint}") from err
    finally:
        del hf
        gc.collect()
    return Reference(arch, tokens, log_probs, flags)


def convert_error(arch: str, err: Exception) -> ValueError:
    """A ValueError naming the family, the installed version's failure and what to try."""
    what = (f"TransformerLens {_backend.TL_VERSION} does not support {arch}" if isinstance(err, NotImplementedError)
            else f"TransformerLens {_backend.TL_VERSION} fails to load {arch} ({type(err).__name__}: {str(err)[:160]})")
    return ValueError(f"{what}: try {_backend.other_version()}")


def compare(model: Model, ref: Reference, dtype: torch.dtype) -> float:
    """The largest log-probability difference between ``model`` and its source, recorded on the model
    for its certificate.

    Raises:
        ValueError: over :data:`SOURCE_TOLERANCE` (the conversion is not the checkpoint's function;
            bias flags the conversion may leave out are named).
    """
    tol = SOURCE_TOLERANCE.get(dtype, 1e-2)
    try:
        with torch.no_grad():
            ours = model(ref.tokens.to(model.cfg.device), return_type="logits").to(torch.float64).log_softmax(-1)
    except Exception as err:
        raise ValueError(f"the converted {ref.architecture} fails on a probe batch ({type(err).__name__}: {str(err)[:160]}); "
                         f"try {_backend.other_version()}") from err
    gap = float((ours.cpu() - ref.log_probs).abs().max()) if ours.shape == ref.log_probs.shape else float("inf")
    if not gap <= tol:
        flags = f" (the checkpoint sets {', '.join(ref.flags)}: parameters a conversion may leave out)" if ref.flags else ""
        raise ValueError(f"TransformerLens {_backend.TL_VERSION}'s conversion of {ref.architecture} does not compute the "
                         f"checkpoint's function: its log-probabilities differ from the Hugging Face model's by {gap:.3g} "
                         f"(tolerance {tol:g} in {dtype}){flags}; try {_backend.other_version()}")
    note_source(model, gap, tol)
    return gap
