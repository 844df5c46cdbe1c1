"""Loading a pretrained Hugging Face causal language model into TransformerLens, by directory or name.

:func:`load_pretrained` is :func:`rs_interp.load_gpt2`'s generic sibling: any architecture the
installed TransformerLens converts (GPT-2, GPT-NeoX/Pythia, GPT-J, Llama, Mistral, Qwen, ...), from a
local checkpoint directory (``config.json``, the weights and the tokenizer, as ``save_pretrained``
writes them) or a hub name. On TransformerLens 3.x the weights go through TransformerLens's own
conversion into a ``HookedTransformer``; on 4.x the Hugging Face model is booted as a
``TransformerBridge`` (``boot_transformers``). Either way TransformerLens's processing follows
(``fold_ln``, ``center_writing_weights``, ``center_unembed``), so the model computes the checkpoint's
function up to a per-position constant on the logits (``center_unembed``; the log-probabilities are
the checkpoint's). GPT-2 directories go through :func:`rs_interp.load_gpt2`.

>>> model = load_pretrained("EleutherAI/pythia-70m")   # doctest: +SKIP
>>> model = load_pretrained("/path/to/saved/checkpoint", dtype=torch.float64)   # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .. import _backend
from .._backend import Model
from .._files import FileError, loading, parsing
from .._messages import clip
from ..tokenizers import GPT2_VOCAB_SIZE, gpt2_tokenizer
from . import _source
from .gpt2_sizes import gpt2_config

__all__ = ["load_pretrained", "WeightsUnavailable"]

#: Files from which ``AutoTokenizer`` can build a tokenizer without the network.
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model")


class WeightsUnavailable(RuntimeError):
    """A pretrained model could not be had from the requested source.

    A ``RuntimeError`` whose message says how to provide the weights.

    >>> import tempfile
    >>> try:
    ...     load_pretrained(tempfile.mkdtemp())  # an empty directory: no config.json
    ... except WeightsUnavailable as err:
    ...     print("no config.json" in str(err))
    True
    """


ENV_VAR = "RS_INTERP_GPT2_PATH"

_GPT2_HOW = (
    "GPT-2's weights come from source='hub' (the network, or a Hugging Face cache holding 'gpt2'), a local checkpoint "
    f"folder (pass it, or set {ENV_VAR}), or source='random'; how to save one: docs/capabilities/models.md."
)


class GPT2WeightsUnavailable(WeightsUnavailable):
    """Pretrained GPT-2 weights could not be had from the requested source (a :class:`WeightsUnavailable`).

    >>> from rs_interp import load_gpt2
    >>> try:
    ...     load_gpt2("./no-such-checkpoint")
    ... except WeightsUnavailable as err:  # catches GPT2WeightsUnavailable too
    ...     print(type(err).__name__)
    GPT2WeightsUnavailable
    """


def _gpt2_from_dir(path: Path, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
                   dtype: torch.dtype) -> Model:
    from transformers import AutoTokenizer, GPT2Config

    if not (path / "config.json").is_file():
        raise GPT2WeightsUnavailable(f"{path} is not a Hugging Face checkpoint directory (no config.json). {_GPT2_HOW}")
    _source.check_folder(path)  # a file missing, truncated or malformed: a FileError naming it
    with parsing(path / "config.json", "Hugging Face config"):
        hf_cfg = GPT2Config.from_pretrained(str(path), local_files_only=True)
        if hf_cfg.n_embd % hf_cfg.n_head:
            raise FileError(f"Hugging Face config {path / 'config.json'}: n_embd {hf_cfg.n_embd} is not a multiple of "
                            f"n_head {hf_cfg.n_head}.", path / "config.json")
        cfg = gpt2_config(
            "small", model_name=path.name, n_layers=hf_cfg.n_layer, d_model=hf_cfg.n_embd, n_heads=hf_cfg.n_head,
            d_head=hf_cfg.n_embd // hf_cfg.n_head, d_mlp=hf_cfg.n_inner or 4 * hf_cfg.n_embd, d_vocab=hf_cfg.vocab_size,
            n_ctx=hf_cfg.n_positions, eps=hf_cfg.layer_norm_epsilon, act_fn=hf_cfg.activation_function, dtype=dtype,
        )
    try:
        ref = _source.reference(str(path), dtype, local=True)
        model = _backend.gpt2_from_hf_dir(path, cfg, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                          center_unembed=center_unembed, dtype=dtype)
    except FileError:
        raise
    except (OSError, ValueError) as err:
        raise GPT2WeightsUnavailable(f"could not read the weights in {path} ({clip(err)}). {_GPT2_HOW}") from err
    _source.compare(model, ref, dtype)
    has_tokenizer_files = any((path / f).is_file() for f in ("tokenizer.json", "vocab.json"))
    with loading(path, "Hugging Face tokenizer in", "transformers"):
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True) if has_tokenizer_files else None
    if tokenizer is not None and len(tokenizer) >= cfg.d_vocab - 1:
        _backend.set_tokenizer(model, tokenizer)
    elif cfg.d_vocab == GPT2_VOCAB_SIZE:  # GPT-2's shape and no tokenizer of its own: GPT-2's (offline)
        _backend.set_tokenizer(model, gpt2_tokenizer())
    return model.eval()


_HOW = ("Pass a local checkpoint folder (config.json, weights and tokenizer, as save_pretrained writes them), or a hub "
        "name with the network or a Hugging Face cache holding it; how: docs/capabilities/models.md.")


def load_pretrained(
    source: str | os.PathLike,
    *,
    fold_ln: bool = True,
    center_writing_weights: bool | None = None,
    center_unembed: bool | None = None,
    dtype: torch.dtype = torch.float32,
) -> Model:
    """A pretrained causal language model as a TransformerLens ``Model`` (see the module docstring).

    Args:
        source: a local checkpoint directory, or a hub name (``"EleutherAI/pythia-70m"``).
        fold_ln: fold the norms' gains (and biases) into the next weights (exact).
        center_writing_weights, center_unembed: TransformerLens's processing; default: ``fold_ln``.
        dtype: parameter dtype (``torch.float64`` for the exact identities).

    Raises:
        WeightsUnavailable: the directory holds no checkpoint (no ``config.json``) or no tokenizer, or the name
            cannot be fetched (no network and no cache); the message says how to provide the weights.
        rs_interp.FileError: a file of the directory is missing, truncated or malformed (``config.json`` not JSON,
            a weight file or shard missing or cut short, weights the config asks for absent or in another shape,
            which transformers would fill at random); the message names the file.
        ValueError: the installed TransformerLens cannot load the architecture, or its conversion does not
            compute the checkpoint's function (the log-probabilities of the loaded model and of the Hugging
            Face model differ on a probe batch beyond the dtype's tolerance), or transformers cannot run the
            family in ``dtype``; each names the family and what to try (the other TransformerLens version,
            another dtype).

    >>> import tempfile
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> path = tempfile.mkdtemp()  # a checkpoint as save_pretrained writes it (tiny, random)
    >>> config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=100, n_positions=16)
    >>> GPT2LMHeadModel(config).save_pretrained(path)
    >>> model = load_pretrained(path, dtype=torch.float64)
    >>> model.cfg.n_layers, model.cfg.dtype
    (1, torch.float64)
    """
    cww = fold_ln if center_writing_weights is None else center_writing_weights
    cu = fold_ln if center_unembed is None else center_unembed
    path = Path(source)
    local = path.is_dir()
    if local:
        config = path / "config.json"
        if not config.is_file():
            raise WeightsUnavailable(f"{path} is not a Hugging Face checkpoint directory (no config.json). {_HOW}")
        model_type = _source.check_folder(path).get("model_type")  # a file missing or malformed: a FileError naming it
        if model_type == "gpt2":  # TransformerLens 3.9's own conversion cannot read a GPT-2 directory
            return _gpt2_from_dir(path, fold_ln=fold_ln, center_writing_weights=cww, center_unembed=cu, dtype=dtype)
        if not any((path / f).is_file() for f in _TOKENIZER_FILES):
            raise WeightsUnavailable(f"{path} holds no tokenizer (none of {', '.join(_TOKENIZER_FILES)}); save it "
                                     "beside the weights: AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR)")
    elif str(source).startswith(("/", ".", "~")) or str(source).count("/") > 1:
        raise WeightsUnavailable(f"{str(source)!r} is neither a directory nor a hub name. {_HOW}")
    where = str(path.resolve() if local else source)
    try:
        ref = _source.reference(where, dtype, local=local)  # the source's own log-probabilities, the model freed after
    except ValueError:
        raise
    except Exception as err:  # no network, no cache (many error types)
        raise WeightsUnavailable(f"could not load {str(source)!r} ({type(err).__name__}: {clip(err)}). {_HOW}") from err
    try:
        model = _backend.from_hf(where, fold_ln=fold_ln, center_writing_weights=cww, center_unembed=cu, dtype=dtype)
    except OSError as err:
        raise WeightsUnavailable(f"could not load {str(source)!r} ({type(err).__name__}: {clip(err)}). {_HOW}") from err
    except Exception as err:  # the architecture: TransformerLens's own error, named with what to try
        raise _source.convert_error(ref.architecture, err) from err
    _source.compare(model, ref, dtype)
    return model.eval()
