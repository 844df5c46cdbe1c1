"""Loading GPT-2 into TransformerLens: from the hub, from a local checkpoint, or at random.

Sources:

- ``"hub"``: ``HookedTransformer.from_pretrained`` on TransformerLens 3.x, ``TransformerBridge.boot_transformers``
  on 4.x (honours the Hugging Face cache and ``HF_HUB_OFFLINE``);
- a path to a local Hugging Face GPT-2 checkpoint directory (``config.json`` plus
  ``model.safetensors``): converted offline with TransformerLens's own weight conversion, no
  network call;
- ``"random"``: random initialisation of the same shape, for structure-only work.

``RS_INTERP_GPT2_PATH`` names a local checkpoint directory for :func:`find_pretrained_gpt2`.

>>> model = load_gpt2("random", size="small")   # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .. import _backend
from .._backend import Model
from .._files import FileError
from .._messages import clip
from ..tokenizers import gpt2_tokenizer
from .checkpoints import build_model
from .gpt2_sizes import _HF_NAMES, GPT2_SIZES, gpt2_config
from .pretrained import _GPT2_HOW as _HOW
from .pretrained import ENV_VAR, GPT2WeightsUnavailable, _gpt2_from_dir

__all__ = ["load_gpt2", "GPT2WeightsUnavailable", "find_pretrained_gpt2", "ENV_VAR"]

def load_gpt2(
    source: str | os.PathLike = "hub",
    *,
    size: str = "small",
    fold_ln: bool = True,
    center_writing_weights: bool | None = None,
    center_unembed: bool | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Model:
    """Load GPT-2 as a ``Model`` (see the module docstring for sources).

    Args:
        source: ``"hub"``, ``"random"`` or a local checkpoint directory.
        size: ``"small"``, ``"medium"``, ``"large"`` or ``"xl"`` (hub and random).
        fold_ln: fold LayerNorm gains and biases into the next weights (exact; the stream's
            LayerNorms become ``LNPre`` on TransformerLens 3.x, ``LN`` with unit gains and zero
            biases on 4.x: the same function). ``False`` keeps LayerNorm explicit.
        center_writing_weights, center_unembed: TransformerLens's processing; default: ``fold_ln``.
        dtype: parameter dtype.
        seed: seed of the ``"random"`` initialisation.

    Raises:
        GPT2WeightsUnavailable: the weights cannot be had; the message says which sources exist
            and how to provide one.
        rs_interp.FileError: a file of a local checkpoint directory is missing, truncated or malformed (named).

    A local checkpoint directory (here a tiny random one; ``load_gpt2("random")`` builds GPT-2
    small itself, 124,439,808 parameters, in a few seconds):

    >>> import tempfile
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> path = tempfile.mkdtemp()
    >>> config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=16)
    >>> GPT2LMHeadModel(config).save_pretrained(path)
    >>> model = load_gpt2(path)  # folded and centred as from_pretrained does
    >>> model.cfg.n_layers, model.cfg.d_model, model.cfg.d_vocab
    (2, 32, 100)
    >>> try:
    ...     load_gpt2(path + "/missing")
    ... except GPT2WeightsUnavailable as err:
    ...     print("source='random'" in str(err))
    True
    """
    cww = fold_ln if center_writing_weights is None else center_writing_weights
    cu = fold_ln if center_unembed is None else center_unembed
    if size not in GPT2_SIZES:
        raise ValueError(f"size must be one of {sorted(GPT2_SIZES)}, got {size!r}")
    if source == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_model(gpt2_config(size, dtype=dtype))
        _backend.set_tokenizer(model, gpt2_tokenizer())  # GPT-2's own, whatever the weights (offline)
        return model.eval()
    if source == "hub":
        try:
            model = _backend.gpt2_from_hub(_HF_NAMES[size], fold_ln=fold_ln, center_writing_weights=cww,
                                           center_unembed=cu, dtype=dtype)
        except Exception as err:  # network, cache and hub errors come in many types
            raise GPT2WeightsUnavailable(f"could not load {_HF_NAMES[size]!r} from the Hugging Face hub or cache "
                                         f"({type(err).__name__}: {clip(err)}). {_HOW}") from err
        return model.eval()
    path = Path(source)
    if not path.exists():
        raise GPT2WeightsUnavailable(f"source {str(source)!r} is neither 'hub', 'random' nor an existing directory. "
                                     f"{_HOW}")
    return _gpt2_from_dir(path, fold_ln=fold_ln, center_writing_weights=cww, center_unembed=cu, dtype=dtype)


def find_pretrained_gpt2(*, fold_ln: bool = True) -> tuple[Model | None, str]:
    """Pretrained GPT-2 small if it is here, without waiting on the network.

    Tries ``$RS_INTERP_GPT2_PATH``, then the Hugging Face cache (looked up on disk first, so a
    machine with no network and no cache answers at once). Returns ``(model, description)`` or ``(None, reason)``:
    a folder that is not there and a folder with a broken file (:class:`rs_interp.FileError`) both give the reason.
    """
    path = os.environ.get(ENV_VAR)
    if path:
        try:
            return load_gpt2(path, fold_ln=fold_ln), f"pretrained weights from {path}"
        except (GPT2WeightsUnavailable, FileError) as err:
            return None, str(err)
    if not _in_hf_cache(_HF_NAMES["small"]):
        return None, (f"no pretrained GPT-2 weights here: {ENV_VAR} is unset and the Hugging Face cache has no "
                      f"'gpt2'. {_HOW}")
    try:
        return load_gpt2("hub", fold_ln=fold_ln), "pretrained weights from the Hugging Face cache"
    except GPT2WeightsUnavailable as err:
        return None, str(err)


def _in_hf_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds ``repo_id``'s config and weights (no network call)."""
    from huggingface_hub import try_to_load_from_cache

    have = lambda f: isinstance(try_to_load_from_cache(repo_id, f), str)  # noqa: E731
    return have("config.json") and (have("model.safetensors") or have("pytorch_model.bin"))
