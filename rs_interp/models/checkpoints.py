"""The toy attention-only models of the theory, and their checkpoints.

Definition 4 of the theory: embedding ``E``, unembedding ``U``, ``n_layers`` blocks of causal
multi-head attention with rotary positions on the full head and query/key biases, no MLP, no
LayerNorm; the logits are exactly ``x_L W_U``. TransformerLens always carries value, output and
unembedding biases; we keep them at zero and out of the optimiser (see
:func:`rs_interp.models.training.trainable_parameters`).

Checkpoints are a safetensors file for the weights and a JSON file for the config: nothing is
ever unpickled.

>>> model = make_attn_only(2, seed=0)
>>> model.cfg.n_heads, model.cfg.d_head, model.cfg.positional_embedding_type
(2, 16, 'rotary')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import _backend
from .._backend import Model, ModelConfig
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


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupted or has an invalid config.

    A ``ValueError``, so code that catches bad input catches it too.

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
        raise CheckpointError(f"config {where} must hold a JSON object, got {type(data).__name__}")
    for key, typ in _REQUIRED_FIELDS.items():
        if key not in data:
            raise CheckpointError(f"config {where} is missing the field {key!r}")
        if isinstance(data[key], bool) or not isinstance(data[key], typ) or data[key] < 1:
            raise CheckpointError(f"config {where}: field {key!r} must be a positive integer, got {data[key]!r}")
    # The fields that define the function; hook flags and bookkeeping are ignored, and a field
    # that changes the function but that this version lacks is refused by name.
    try:
        fields = _backend.readable_fields(data)
    except ValueError as err:
        raise CheckpointError(f"config {where}: {err}") from err
    if isinstance(fields.get("dtype"), str):
        dt = getattr(torch, fields["dtype"], None)
        if not isinstance(dt, torch.dtype):
            raise CheckpointError(f"config {where}: unknown dtype {fields['dtype']!r}")
        fields["dtype"] = dt
    fields["device"] = "cpu"
    try:
        return _backend.make_config(**fields)
    except Exception as err:  # TransformerLens raises assorted errors for inconsistent configs
        raise CheckpointError(f"config {where} is not a valid config for TransformerLens {_backend.TL_VERSION}: {err}") from err


def _checkpoint_files(path: str | Path) -> tuple[Path, Path]:
    path = Path(path)
    if path.suffix in (_CONFIG_SUFFIX, _WEIGHTS_SUFFIX):
        path = path.with_suffix("")
    return path.with_name(path.name + _CONFIG_SUFFIX), path.with_name(path.name + _WEIGHTS_SUFFIX)


def made_with() -> dict[str, str]:
    """The torch and TransformerLens versions of this process: what :func:`save_model` records as
    ``metadata["versions"]``."""
    return {"torch": torch.__version__, "transformer_lens": _backend.TL_VERSION}


def save_model(model: Model, path: str | Path, *, metadata: dict[str, Any] | None = None) -> Path:
    """Save ``model`` as ``path.json`` (config, plus ``metadata``) and ``path.safetensors``.

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
    save_file(_backend.portable_state(model), str(w_path))
    payload = {"config": _config_to_json(model.cfg), "metadata": {"versions": made_with(), **(metadata or {})}}
    cfg_path.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return cfg_path.with_suffix("")


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The ``metadata`` dictionary stored beside a checkpoint (seeds, training settings, metrics)."""
    cfg_path, _ = _checkpoint_files(path)
    return dict(json.loads(cfg_path.read_text()).get("metadata", {}))


def load_model(path: str | Path) -> Model:
    """Load a checkpoint written by :func:`save_model`, validating both files.

    Raises:
        CheckpointError: (a ``ValueError``) if a file is missing, the JSON config lacks or has
            wrong fields, or the safetensors file is truncated, corrupted or does not match.

    >>> import tempfile, torch
    >>> model = make_attn_only(1)
    >>> path = save_model(model, tempfile.mkdtemp() + "/toy")
    >>> tokens = torch.zeros(1, 4, dtype=torch.long)
    >>> bool(torch.equal(load_model(path)(tokens), model(tokens)))
    True
    """
    cfg_path, w_path = _checkpoint_files(path)
    for p in (cfg_path, w_path):
        if not p.is_file():
            raise CheckpointError(f"checkpoint file {p} does not exist (path={str(path)!r})")
    try:
        payload = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"config {cfg_path} is not valid JSON: {err}") from err
    if not isinstance(payload, dict) or "config" not in payload:
        raise CheckpointError(f"config {cfg_path} must be a JSON object with a 'config' field")
    cfg = _config_from_json(payload["config"], cfg_path)
    try:
        state = load_file(str(w_path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"weights {w_path} are truncated or corrupted: {err}") from err
    model = build_model(cfg)
    # Buffers (masks, rotary tables) are rebuilt from the config; older checkpoints carry them.
    state = {k: v for k, v in state.items() if not k.endswith(_backend._HT_BUFFERS)}
    expected = _backend.expected_keys(model)
    missing, extra = set(expected) - set(state), set(state) - set(expected)
    if missing or extra:
        raise CheckpointError(f"weights {w_path} do not match the config: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    for k, v in state.items():
        if tuple(v.shape) != expected[k]:
            raise CheckpointError(f"weights {w_path}: {k} has shape {tuple(v.shape)}, config wants {expected[k]}")
    try:
        _backend.load_portable_state(model, state)
    except ValueError as err:
        raise CheckpointError(f"weights {w_path}: {err}") from err
    model.eval()
    return model
