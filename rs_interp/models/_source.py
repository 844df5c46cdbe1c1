"""A loaded model against its source: the Hugging Face model's log-probabilities on a probe batch,
compared with the converted model's, and the refusals of a load that cannot be had.

TransformerLens converts a checkpoint's weights into its own modules (3.x) or boots the Hugging Face
modules and processes their weights (4.x); either can silently compute another function (3.9 drops a
Llama checkpoint's ``attention_bias`` and ``mlp_bias``). :func:`reference` runs the Hugging Face model
first (then frees it: the peak is one model, not two) and :func:`compare` refuses a converted model
whose log-probabilities are not the source's.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import _backend
from .._backend import Model
from .._files import FileError, loading, parsing, read_json, safetensors_metadata
from .._messages import clip, few
from ..exact.certificate import note_source

__all__: list[str] = []

#: The largest log-probability difference accepted between a loaded model and its source, by dtype:
#: float64 leaves room for the steps Hugging Face computes in float32 whatever the dtype (measured
#: up to 1.7e-6 on the tested families), float32 for TransformerLens's folding and centring.
SOURCE_TOLERANCE = {torch.float64: 1e-4, torch.float32: 1e-2, torch.float16: 0.25, torch.bfloat16: 0.25}

#: Config flags that add parameters some conversions leave out: named when a conversion misses.
_BIAS_FLAGS = ("attention_bias", "mlp_bias", "qkv_bias", "use_bias", "bias", "add_bias_linear", "use_qkv_bias")


@dataclass(frozen=True)
class Reference:
    """The source's log-probabilities on the probe batches, one per length."""

    architecture: str
    tokens: tuple[torch.Tensor, ...]
    log_probs: tuple[torch.Tensor, ...]
    flags: tuple[str, ...]
    windows: tuple[tuple[str, int], ...] = ()


#: A Hugging Face folder's weights, as ``save_pretrained`` writes them: an index naming shards, or one file.
_WEIGHTS = (("model.safetensors.index.json", True), ("model.safetensors", False),
            ("pytorch_model.bin.index.json", True), ("pytorch_model.bin", False))


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a local Hugging Face checkpoint folder: the shards its index names, or its one file.

    Raises:
        FileError: no weights, an index that is not JSON or names no shard, a shard it names missing.
    """
    for name, index in _WEIGHTS:
        if not (folder / name).is_file():
            continue
        if not index:
            return [folder / name]
        with parsing(folder / name, "Hugging Face weight index"):
            shards = sorted({str(v) for v in read_json(folder / name,
                                                       "Hugging Face weight index")["weight_map"].values()})
        missing = [f for f in shards if not (folder / f).is_file()]
        if not shards or missing:
            raise FileError(f"Hugging Face weight index {folder / name} names "
                            f"{'no shard' if not shards else 'shards that are missing: ' + few(missing)}.",
                            folder / name)
        return [folder / f for f in shards]
    raise FileError(f"Hugging Face checkpoint {folder} holds no weights (no model.safetensors, pytorch_model.bin or "
                    "index of their shards).", folder)


def check_folder(folder: Path) -> dict:
    """The ``config.json`` of a local Hugging Face checkpoint folder, its files checked before transformers
    reads them: the config a JSON object, the weights there, each safetensors file's header whole (a
    truncated file is refused here, by name), the tokenizer's and generation's JSON files JSON objects. A pickled
    ``.bin`` file is checked by transformers' reading it. A flipped byte inside a weight cannot be seen: a Hugging
    Face folder stores no digest.

    Raises:
        FileError: a file missing, truncated or malformed (named).
    """
    config = read_json(folder / "config.json", "Hugging Face config")
    for f in weight_files(folder):
        if f.suffix == ".safetensors":
            safetensors_metadata(f, "Hugging Face weights")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (folder / name).is_file():  # the JSON files beside them, read by transformers' and TransformerLens's loaders
            read_json(folder / name, "Hugging Face file")
    return config


def _loaded(source: str, local: bool, dtype: torch.dtype):
    """The Hugging Face model of ``source``, refused when its files do not hold every weight its config asks
    for, in the shape it asks (transformers fills a missing or misshapen weight with a random one and warns)."""
    from transformers import AutoModelForCausalLM

    with loading(source, "Hugging Face checkpoint", "transformers") if local else contextlib.nullcontext():
        hf, info = AutoModelForCausalLM.from_pretrained(source, local_files_only=local, dtype=dtype,
                                                        output_loading_info=True, ignore_mismatched_sizes=True)
    missing = sorted(info.get("missing_keys") or ())
    shapes = sorted(str(m[0] if isinstance(m, (tuple, list)) else m) for m in info.get("mismatched_keys") or ())
    if missing or shapes:
        what = (f"lack {few(missing)}" if missing else "") + (" and " if missing and shapes else "") + \
               (f"hold {few(shapes)} in another shape than the config's" if shapes else "")
        files = f" ({few(f.name for f in weight_files(Path(source)))})" if local else ""
        raise FileError(f"the weights of Hugging Face checkpoint {source}{files} {what}: the files are incomplete or "
                        "do not belong to this config.json. Save the checkpoint again (save_pretrained).", source)
    return hf.eval()


def architecture(config: dict) -> str:
    return (config.get("architectures") or [config.get("model_type", "an unknown architecture")])[0]


def windows(config: dict) -> tuple[tuple[str, int], ...]:
    """The lengths past which the config says attention or positions change: a sliding window
    (``sliding_window`` where used, ``window_size``, ``attention_window``) and a rotary scaling's
    original context (``rope_scaling.original_max_position_embeddings``), each with its name.

    >>> windows({"sliding_window": 16, "use_sliding_window": False, "window_size": 8})
    (('window_size', 8),)
    """
    out = []
    for key in ("sliding_window", "window_size", "attention_window", "local_window_size"):
        value = config.get(key)
        if key == "sliding_window" and config.get("use_sliding_window") is False:
            continue  # declared but switched off (Qwen2's default)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out.append((key, value))
    scaling = config.get("rope_scaling") or {}
    original = scaling.get("original_max_position_embeddings") if isinstance(scaling, dict) else None
    if isinstance(original, int) and original > 0:
        out.append(("rope_scaling.original_max_position_embeddings", original))
    return tuple(out)


def probe_lengths(n_ctx: int, declared: tuple[tuple[str, int], ...]) -> list[int]:
    """The probe's lengths: 8 tokens, and past every window the config declares (``w + 8`` and ``2 w + 3``,
    so positions on both sides of the window and of its multiples are compared), within the context.

    >>> probe_lengths(64, (("sliding_window", 16),)), probe_lengths(64, (("sliding_window", 64),))
    ([8, 24, 35], [8])
    """
    lengths = {min(8, n_ctx)}
    for _, w in declared:
        if w < n_ctx:  # a window at least as long as the context never binds
            lengths |= {min(w + 8, n_ctx), min(2 * w + 3, n_ctx)}
    return sorted(lengths)


def reference(source: str, dtype: torch.dtype, *, local: bool) -> Reference:
    """The Hugging Face model's log-probabilities on probe batches (2 x 8 random token ids, and one
    sequence past every window the config declares: :func:`probe_lengths`), the model freed after.

    Raises:
        ValueError: transformers cannot run this family in ``dtype`` (named, with the dtype to use).
        FileError: a local folder's file missing, truncated or malformed, or weights the config asks for
            missing or misshapen (named).
    """
    from transformers import AutoConfig

    config = check_folder(Path(source)) if local else AutoConfig.from_pretrained(source).to_dict()
    arch = architecture(config)
    flags = tuple(f for f in _BIAS_FLAGS if config.get(f))
    hf = _loaded(source, local, dtype)
    vocab = min(int(config.get("vocab_size") or hf.config.vocab_size), hf.get_input_embeddings().num_embeddings)
    n_ctx = int(config.get("max_position_embeddings") or config.get("n_positions") or config.get("seq_length") or 8)
    declared = windows(config)
    g = torch.Generator().manual_seed(0)
    tokens = tuple(torch.randint(0, vocab, (2 if n == min(8, n_ctx) else 1, n),
                                 generator=g) for n in probe_lengths(n_ctx, declared))
    try:
        with torch.no_grad():
            log_probs = tuple(hf(t).logits.to(torch.float64).log_softmax(-1) for t in tokens)
    except Exception as err:
        dtype_error = any(w in str(err) for w in ("Float", "Double", "dtype", "Half", "BFloat16"))
        hint = ("load it with dtype=torch.float32" if dtype_error else
                "the checkpoint or transformers' implementation of this family does not run, so there is nothing to "
                "convert")
        raise ValueError(f"transformers' own {arch} fails on a probe batch in {dtype} ({type(err).__name__}: "
                         f"{clip(err)}): {hint}") from err
    finally:
        del hf
        gc.collect()
    return Reference(arch, tokens, log_probs, flags, declared)


def convert_error(arch: str, err: Exception) -> ValueError:
    """A ValueError naming the family, the installed version's failure and what to try."""
    what = (f"TransformerLens {_backend.TL_VERSION} does not support {arch}" if isinstance(err, NotImplementedError)
            else f"TransformerLens {_backend.TL_VERSION} fails to load {arch} ({type(err).__name__}: {clip(err)})")
    return ValueError(f"{what}: try {_backend.other_version()}")


def compare(model: Model, ref: Reference, dtype: torch.dtype) -> float:
    """The largest log-probability difference between ``model`` and its source, recorded on the model
    for its certificate.

    Raises:
        ValueError: over :data:`SOURCE_TOLERANCE` (the conversion is not the checkpoint's function;
            bias flags the conversion may leave out are named).
    """
    tol = SOURCE_TOLERANCE.get(dtype, 1e-2)
    gap, where = 0.0, ""
    for tokens, theirs in zip(ref.tokens, ref.log_probs):
        try:
            with torch.no_grad():
                ours = model(tokens.to(model.cfg.device), return_type="logits").to(torch.float64).log_softmax(-1)
        except Exception as err:
            raise ValueError(f"the converted {ref.architecture} fails on a probe batch of {tokens.shape[1]} tokens "
                             f"({type(err).__name__}: {clip(err)}); try {_backend.other_version()}") from err
        here = float((ours.cpu() - theirs).abs().max()) if ours.shape == theirs.shape else float("inf")
        if not here <= gap:
            gap, where = here, f"{tokens.shape[1]} tokens"
    if not gap <= tol:
        flags = (f" (the checkpoint sets {', '.join(ref.flags)}: parameters a conversion may leave out)"
                 if ref.flags else "")
        past = [f"{name} {w}" for name, w in ref.windows if w < int(where.split()[0])]
        window = (f", past the {' and '.join(past)} the config declares (a window or scaling the conversion may drop)"
                  if past else "")
        raise ValueError(f"TransformerLens {_backend.TL_VERSION}'s conversion of {ref.architecture} does not compute "
                         "the checkpoint's function: its log-probabilities differ from the Hugging Face model's by "
                         f"{gap:.3g} at {where}{window} (tolerance {tol:g} in {dtype}){flags}; try "
                         f"{_backend.other_version()}")
    note_source(model, gap, tol)
    return gap
