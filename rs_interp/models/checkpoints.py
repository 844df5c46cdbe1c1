"""The toy attention-only models of the theory, and their checkpoints.

Definition 4 of the theory: embedding ``E``, unembedding ``U``, ``n_layers`` blocks of causal
multi-head attention with rotary positions on the full head and query/key biases, no MLP, no
LayerNorm; the logits are exactly ``x_L W_U``. TransformerLens always carries value, output and
unembedding biases; we keep them at zero and out of the optimiser (see
:func:`rs_interp.models.training.trainable_parameters`).

Checkpoints are a safetensors file for the weights and a JSON file for the config, with a sha256 digest
of every tensor and of the config beside it: nothing is ever unpickled, and a file changed after it
was saved is refused, not read.

>>> model = make_attn_only(2, seed=0)
>>> model.cfg.n_heads, model.cfg.d_head, model.cfg.positional_embedding_type
(2, 16, 'rotary')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .. import _backend
from .._backend import Model, ModelConfig
from .._files import FileError, digest, json_digest, read_json, read_safetensors
from .._messages import clip, few
from ..exact.validate import check_int_range

__all__ = [
    "attn_only_config",
    "make_attn_only",
    "build_model",
    "as_dtype",
    "save_model",
    "load_model",
    "read_metadata",
    "made_with",
    "CheckpointError",
]

_CONFIG_SUFFIX = ".json"
_WEIGHTS_SUFFIX = ".safetensors"


class CheckpointError(FileError):
    """A checkpoint is missing, truncated, corrupted (a tensor or the config differs from its digest) or has
    an invalid config.

    A :class:`rs_interp.FileError` (the error of every file rs_interp reads), so a ``ValueError``: code that
    catches bad input catches it too.

    >>> import tempfile
    >>> try:
    ...     load_model(tempfile.mkdtemp() + "/missing")
    ... except CheckpointError as err:
    ...     print(type(err).__name__, isinstance(err, ValueError))
    CheckpointError True
    """


def attn_only_config(n_layers: int = 2, **overrides: Any) -> ModelConfig:
    """The theory's attention-only model as a ``ModelConfig``.

    ``d_model=32``, two heads of ``d_head=16``, ``d_vocab=256``, ``n_ctx=48``, causal attention,
    rotary positions over the whole head, no LayerNorm and no MLP. Any field can be overridden.

    >>> cfg = attn_only_config(1, d_vocab=64)
    >>> (cfg.n_layers, cfg.d_model, cfg.rotary_dim, cfg.normalization_type)
    (1, 32, 16, None)
    """
    check_int_range("n_layers", n_layers, 1)
    fields: dict[str, Any] = dict(
        n_layers=n_layers,
        d_model=32,
        n_heads=2,
        d_head=16,
        d_vocab=256,
        n_ctx=48,
        attn_only=True,
        normalization_type=None,
        positional_embedding_type="rotary",
        rotary_dim=16,
        attention_dir="causal",
        act_fn=None,
        seed=None,
        device="cpu",
    )
    fields.update(overrides)
    if "rotary_dim" not in overrides and "d_head" in overrides:
        fields["rotary_dim"] = fields["d_head"]
    return _backend.make_config(**fields)


def build_model(cfg: ModelConfig) -> Model:
    """Construct a randomly initialised model from ``cfg``: a ``Model`` on
    TransformerLens 3.x, a native ``TransformerBridge`` in compatibility mode on 4.x.

    The initialisation draws from the global RNG (seed it, or use :func:`make_attn_only`); the same
    seed gives different weights under the two versions, trained checkpoints load identically.
    """
    return _backend.build_model(cfg)


def make_attn_only(n_layers: int = 2, *, seed: int = 0, **overrides: Any) -> Model:
    """A freshly initialised toy model, deterministic for a given ``seed``.

    Weights come from TransformerLens's GPT-2-style initialisation; ``b_V``, ``b_O`` and ``b_U``
    are zero (TransformerLens initialises every bias to zero).

    >>> a, b = make_attn_only(1, seed=3), make_attn_only(1, seed=3)
    >>> bool(torch.equal(a.W_E, b.W_E))
    True
    """
    check_int_range("seed", seed, 0)
    cfg = attn_only_config(n_layers, **overrides)
    # The global RNG is what TransformerLens's initialisers draw from: fork it so that building
    # a model never changes the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(cfg)
    model.eval()
    return model


def as_dtype(model: Model, dtype: torch.dtype) -> Model:
    """A copy of ``model`` in ``dtype`` (e.g. ``torch.float64`` for the exact identities); the original is untouched.

    >>> m64 = as_dtype(make_attn_only(1), torch.float64)
    >>> m64.W_Q.dtype, m64.cfg.dtype
    (torch.float64, torch.float64)
    """
    if not _backend.is_model(model):
        raise ValueError(f"model must be a TransformerLens model, got {type(model).__name__}")
    copy = _backend.with_dtype(model, dtype)
    if model.tokenizer is not None:
        _backend.set_tokenizer(copy, model.tokenizer)
    for mine, theirs in zip(copy.modules(), model.modules()):
        mine.training = theirs.training  # every submodule's mode, as in the original
    return copy


def _config_to_json(cfg: ModelConfig) -> dict[str, Any]:
    """The portable fields (named as both TransformerLens versions name them) and every other field
    that changes the function and differs from a config of the same shape, JSON-ready."""
    out = {name: getattr(cfg, name, None) for name in _backend.PORTABLE_FIELDS} | _backend.config_extras(cfg)
    return {k: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v for k, v in out.items()}


_REQUIRED_FIELDS = {"n_layers": int, "d_model": int, "n_ctx": int, "d_head": int, "n_heads": int, "d_vocab": int}


def _config_from_json(data: Any, where: Path) -> ModelConfig:
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint config {where}: 'config' holds a {type(data).__name__}, not a JSON object.",
                              where)
    for key, typ in _REQUIRED_FIELDS.items():
        if key not in data:
            raise CheckpointError(f"checkpoint config {where} lacks the field {key!r}.", where)
        if isinstance(data[key], bool) or not isinstance(data[key], typ) or data[key] < 1:
            raise CheckpointError(f"checkpoint config {where}: field {key!r} must be a positive integer, not "
                                  f"{clip(repr(data[key]), 40)}.", where)
    # The fields that define the function; hook flags and bookkeeping are ignored, and a field
    # that changes the function but that this version lacks is refused by name.
    try:
        fields = _backend.readable_fields(data)
    except ValueError as err:
        raise CheckpointError(f"checkpoint config {where}: {err}", where) from err
    if isinstance(fields.get("dtype"), str):
        dt = getattr(torch, fields["dtype"], None)
        if not isinstance(dt, torch.dtype):
            raise CheckpointError(f"checkpoint config {where}: unknown dtype {clip(repr(fields['dtype']), 40)}.", where)
        fields["dtype"] = dt
    fields["device"] = "cpu"
    try:
        return _backend.make_config(**fields)
    except Exception as err:  # TransformerLens raises assorted errors for inconsistent configs
        raise CheckpointError(f"checkpoint config {where} is not a valid config for TransformerLens "
                              f"{_backend.TL_VERSION} "
                              f"({clip(err)}).", where) from err


def _checkpoint_files(path: str | Path) -> tuple[Path, Path]:
    path = Path(path)
    if path.suffix in (_CONFIG_SUFFIX, _WEIGHTS_SUFFIX):
        path = path.with_suffix("")
    return path.with_name(path.name + _CONFIG_SUFFIX), path.with_name(path.name + _WEIGHTS_SUFFIX)


def made_with() -> dict[str, str]:
    """The torch and TransformerLens versions of this process: what :func:`save_model` records as
    ``metadata["versions"]``."""
    return {"torch": torch.__version__, "transformer_lens": _backend.TL_VERSION}


def _digests(config: dict[str, Any], state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What :func:`save_model` stores beside the config: the sha256 of the config and of every tensor."""
    return {"algorithm": "sha256", "config": json_digest(config),
            "tensors": {k: digest(v) for k, v in sorted(state.items())}}


def save_model(model: Model, path: str | Path, *, metadata: dict[str, Any] | None = None) -> Path:
    """Save ``model`` as ``path.json`` (config, plus ``metadata``) and ``path.safetensors``.

    ``path.json`` also holds ``digests``: the sha256 of the config and of every tensor
    (:func:`rs_interp._files.digest`: its dtype, shape and bytes), which :func:`load_model` checks.
    ``metadata["versions"]`` records the torch and TransformerLens versions it was saved with
    (:func:`made_with`), unless ``metadata`` already says.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> p = save_model(make_attn_only(1), f"{d}/toy")
    >>> load_model(p).cfg.n_layers
    1
    """
    cfg_path, w_path = _checkpoint_files(path)
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    # Model's names and shapes under either version: one format for both.
    state = _backend.portable_state(model)
    save_file(state, str(w_path))
    config = json.loads(json.dumps(_config_to_json(model.cfg)))  # as load_model will read it back
    payload = {"config": config, "metadata": {"versions": made_with(), **(metadata or {})},
               "digests": _digests(config, state)}
    cfg_path.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return cfg_path.with_suffix("")


def _payload(cfg_path: Path) -> dict[str, Any]:
    payload = read_json(cfg_path, "checkpoint config")
    if "config" not in payload:
        raise CheckpointError(f"checkpoint config {cfg_path} has no 'config' field (save_model writes one).", cfg_path)
    return payload


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``metadata`` dictionary stored beside a checkpoint (seeds, training settings, metrics).

    Raises:
        CheckpointError: the JSON file is missing or malformed.
    """
    cfg_path, _ = _checkpoint_files(path)
    try:
        return dict(_payload(cfg_path).get("metadata", {}))
    except CheckpointError:
        raise
    except FileError as err:
        raise CheckpointError(str(err), err.path) from err


def load_model(path: str | Path) -> Model:
    """Load a checkpoint written by :func:`save_model`, validating both files.

    The rule for digests: a checkpoint whose JSON holds ``digests`` (every one :func:`save_model` writes)
    loads only if the config and every tensor match them, bit for bit. One saved before rs_interp recorded
    digests has none: it loads with its config, tensor names and shapes checked, as before. A config edited
    by hand no longer matches its digest; delete the ``digests`` entry to load it as such an older file.

    Raises:
        CheckpointError: (a ``ValueError``) if a file is missing, truncated or not JSON/safetensors, the
            config or a tensor differs from its digest (the tensor named), the JSON config lacks or has
            wrong fields, or the tensors do not match the config.

    >>> import tempfile, torch
    >>> model = make_attn_only(1)
    >>> path = save_model(model, tempfile.mkdtemp() + "/toy")
    >>> tokens = torch.zeros(1, 4, dtype=torch.long)
    >>> bool(torch.equal(load_model(path)(tokens), model(tokens)))
    True
    """
    cfg_path, w_path = _checkpoint_files(path)
    try:
        return _load(cfg_path, w_path)
    except CheckpointError:
        raise
    except FileError as err:  # from the readers: the same message, as a checkpoint's error
        raise CheckpointError(str(err), err.path) from err


def _check_digests(digests: Any, config: Any, state: dict[str, torch.Tensor], cfg_path: Path, w_path: Path) -> None:
    """Refuse a config or a tensor that differs from the digest :func:`save_model` stored (``digests``)."""
    if (not isinstance(digests, dict) or digests.get("algorithm") != "sha256"
            or not isinstance(digests.get("tensors"), dict)):
        raise CheckpointError(f"checkpoint config {cfg_path}: its 'digests' entry is malformed (save_model writes "
                              "an algorithm, a config digest and one digest per tensor).", cfg_path)
    if digests.get("config") != json_digest(config):
        raise CheckpointError(f"checkpoint config {cfg_path}: the config does not match its sha256 digest (the file "
                              "changed after it was saved). Restore it, or save the model again.", cfg_path)
    listed = digests["tensors"]
    if set(listed) != set(state):
        odd = sorted(set(listed) ^ set(state))
        raise CheckpointError(f"checkpoint weights {w_path}: its tensors differ from those whose digests "
                              f"{cfg_path.name} lists ({few(odd)}). Restore the file, or save the model again.", w_path)
    for name, tensor in state.items():
        if listed[name] != digest(tensor):
            raise CheckpointError(f"checkpoint weights {w_path}: tensor {name!r} does not match its sha256 digest in "
                                  f"{cfg_path.name} (the file changed after it was saved). Restore it, or save the "
                                  "model again.", w_path)


def _load(cfg_path: Path, w_path: Path) -> Model:
    for p, what in ((cfg_path, "config"), (w_path, "weights")):
        if not p.is_file():
            raise CheckpointError(f"checkpoint {what} {p} does not exist.", p)
    payload = _payload(cfg_path)
    state = read_safetensors(w_path, "checkpoint weights")
    if "digests" in payload:
        _check_digests(payload["digests"], payload["config"], state, cfg_path, w_path)
    cfg = _config_from_json(payload["config"], cfg_path)
    model = build_model(cfg)
    # Buffers (masks, rotary tables) are rebuilt from the config; older checkpoints carry them.
    state = {k: v for k, v in state.items() if not k.endswith(_backend._HT_BUFFERS)}
    expected = _backend.expected_keys(model)
    missing, extra = set(expected) - set(state), set(state) - set(expected)
    if missing or extra:
        raise CheckpointError(f"checkpoint weights {w_path} do not match the config: missing "
                              f"{few(sorted(missing)) or 'none'}, unexpected {few(sorted(extra)) or 'none'}.", w_path)
    for k, v in state.items():
        if tuple(v.shape) != expected[k]:
            raise CheckpointError(f"checkpoint weights {w_path}: tensor {k!r} has shape {tuple(v.shape)}, the config "
                                  f"wants {expected[k]}.", w_path)
    try:
        _backend.load_portable_state(model, state)
    except ValueError as err:
        raise CheckpointError(f"checkpoint weights {w_path}: {err}", w_path) from err
    model.eval()
    return model
