"""Every difference between TransformerLens 3.x and 4.x, in one place.

TransformerLens 3.x builds models as ``HookedTransformer`` from a ``HookedTransformerConfig``;
4.0 removed both for ``TransformerBridge`` / ``TransformerBridgeConfig``. With
``enable_compatibility_mode`` the bridge has the surface the analyses use (hook names, ``W_Q`` ...
``W_U``, ``model.hooks``, ``run_with_cache``, ``start_at_layer``), so the analyses import
:data:`Model` and call the few functions here where the two differ:

- building a model from a config (:func:`make_config`, :func:`build_model`); the 4.x models are
  TransformerLens-native bridges (``boot_native``), which know standard and rotary positions only;
- the checkpoint format (:func:`portable_state`, :func:`load_portable_state`): always
  HookedTransformer's parameter names and shapes, so a model saved under either version loads under
  the other. The native bridge rotates adjacent pairs ``(2i, 2i + 1)`` where HookedTransformer
  rotates ``(i, i + d/2)``: each head's query and key dimensions are permuted on the way in and
  out (scores are unchanged by a permutation shared by queries and keys);
- per-head query/key/value inputs (:func:`per_head_inputs`): native bridge attention has no
  ``hook_q_input`` ... (``set_use_split_qkv_input`` raises), so those hook names are emulated: the
  per-head input is formed from ``hook_resid_pre`` and the projection recomputed from it, exactly
  as HookedTransformer's split-input path does;
- rotary application (:func:`apply_rotary`), the frozen biases (:func:`bias_parameters`),
  GPT-2 loading (:func:`gpt2_from_hf_dir`, :func:`gpt2_from_hub`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import math
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

__all__ = ["TL_VERSION", "TL_MAJOR", "Model", "ModelConfig", "transformer_lens_version"]

TL_VERSION: str = importlib.metadata.version("transformer-lens")
TL_MAJOR: int = int(TL_VERSION.split(".")[0])

if TL_MAJOR >= 4:
    import transformer_lens.model_bridge.sources.native  # noqa: F401  (attaches boot_native)
    from transformer_lens import TransformerBridge as Model
    from transformer_lens import TransformerBridgeConfig as ModelConfig
else:
    from transformer_lens import HookedTransformer as Model
    from transformer_lens import HookedTransformerConfig as ModelConfig

#: The config fields a checkpoint records: what defines the function a model computes, named as
#: both versions name them.
PORTABLE_FIELDS = (
    "n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "d_vocab_out", "n_ctx", "attn_only",
    "normalization_type", "positional_embedding_type", "rotary_dim", "rotary_base", "act_fn", "eps",
    "attention_dir", "gated_mlp", "final_rms", "use_attn_scale", "attn_scale", "dtype", "model_name",
    "original_architecture", "initializer_range", "init_mode", "seed", "default_prepend_bos",
    "output_logits_soft_cap", "attn_scores_soft_cap", "n_key_value_heads",
)

_NATIVE_POSITIONS = ("standard", "rotary")


def transformer_lens_version() -> str:
    """The TransformerLens version rs_interp runs on, e.g. ``"3.9.0"`` or ``"4.3.0"``."""
    return TL_VERSION


def is_model(obj: Any) -> bool:
    """Whether ``obj`` is a model of the installed TransformerLens (HookedTransformer or bridge)."""
    return isinstance(obj, Model)


def config_fields() -> frozenset[str]:
    """The field names the installed ``ModelConfig`` accepts."""
    if TL_MAJOR >= 4:
        import inspect

        from transformer_lens.config.transformer_lens_config import TransformerLensConfig

        own = set(inspect.signature(ModelConfig.__init__).parameters) - {"self", "kwargs"}
        return frozenset(own | {f.name for f in dataclasses.fields(TransformerLensConfig)})
    return frozenset(f.name for f in dataclasses.fields(ModelConfig))


def make_config(**fields: Any) -> ModelConfig:
    """A config of the installed version from HookedTransformerConfig-style fields.

    Raises:
        NotImplementedError: on 4.x, a positional scheme the native bridge cannot build
            (shortformer, alibi), or a gated MLP with biases; the message says to use 3.x.
        ValueError: a field the installed version does not know.
    """
    unknown = set(fields) - config_fields()
    if unknown:
        raise ValueError(f"unknown config fields for TransformerLens {TL_VERSION}: {sorted(unknown)}")
    if TL_MAJOR < 4:
        return ModelConfig(**fields)
    pos = fields.get("positional_embedding_type", "standard")
    if pos not in _NATIVE_POSITIONS:
        raise NotImplementedError(
            f"positional_embedding_type={pos!r}: TransformerLens {TL_VERSION}'s native models have "
            f"{' and '.join(_NATIVE_POSITIONS)} positions only; use TransformerLens 3.x for {pos!r}"
        )
    if fields.get("rotary_adjacent_pairs"):
        raise NotImplementedError("rotary_adjacent_pairs=True is not a portable layout; rs_interp uses (i, i + d/2)")
    fields = dict(fields)
    fields.pop("rotary_adjacent_pairs", None)
    if fields.get("act_fn") is None:
        fields["act_fn"] = "gelu_new"  # attention-only models never call it
    return ModelConfig(**fields)


def build_model(cfg: ModelConfig) -> Model:
    """A randomly initialised model of ``cfg`` (the caller seeds the global RNG).

    3.x: ``HookedTransformer(cfg)``, silencing its deprecation warning. 4.x: a native
    ``TransformerBridge`` in compatibility mode with no weight processing, so the weights are
    exactly what was loaded or trained.
    """
    if TL_MAJOR < 4:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
            return Model(cfg)
    cfg = make_config(**{k: getattr(cfg, k) for k in PORTABLE_FIELDS if hasattr(cfg, k)} | {"device": "cpu"})
    with torch.random.fork_rng(devices=[]):  # the native init's draws must not shift the caller's RNG
        model = Model.boot_native(cfg, dtype=cfg.dtype)
    _compatible(model, no_processing=True)
    _tl3_rotary_tables(model)
    _tl3_init(model)
    for module in model.modules():
        # The bridge's RMS norms call TransformerLens's NativeRMSNorm, which computes in float32
        # whatever the model's dtype; its own Python path computes HookedTransformer's formula in
        # the model's dtype (float64 stays exact).
        if getattr(module, "use_native_layernorm_autograd", False):
            module.use_native_layernorm_autograd = False
    return model


def _tl3_rotary_tables(model: Model) -> None:
    """Recompute the native rotary tables as HookedTransformer computes them: ``pos / base^(i / (r/2))``
    in float64 for a float64 model (the native tables are float32 whatever the dtype, so a float64
    model would carry float32 angles), laid out for adjacent pairs."""
    cfg = model.cfg
    for module in model.modules():
        if type(module).__name__ != "NativeRotary":
            continue
        r = module.rotary_dim
        high = torch.float64 if cfg.dtype == torch.float64 else torch.float32
        pos = torch.arange(cfg.n_ctx, dtype=high)
        freq = float(cfg.rotary_base) ** (torch.arange(r // 2, dtype=high) / (r / 2))
        angles = (pos[:, None] / freq[None, :]).repeat_interleave(2, dim=-1)
        module.cos_cached = angles.cos().to(cfg.dtype)
        module.sin_cached = angles.sin().to(cfg.dtype)


def _tl3_order(cfg: Any) -> list[str]:
    """HookedTransformer's parameters in its ``named_parameters`` order (the order it initialises them)."""
    norm = {"LN": ["w", "b"], "RMS": ["w"]}.get(cfg.normalization_type, [])
    names = ["embed.W_E"] + (["pos_embed.W_pos"] if cfg.positional_embedding_type == "standard" else [])
    for l in range(cfg.n_layers):
        names += [f"blocks.{l}.ln1.{p}" for p in norm]
        if not cfg.attn_only:
            names += [f"blocks.{l}.ln2.{p}" for p in norm]
        names += [f"blocks.{l}.attn.{p}" for p in ("W_Q", "W_O", "b_Q", "b_O", "W_K", "W_V", "b_K", "b_V")]
        if not cfg.attn_only:
            names += [f"blocks.{l}.mlp.{p}" for p in ("W_in", "b_in", "W_out", "b_out")]
    return names + [f"ln_final.{p}" for p in norm] + ["unembed.W_U", "unembed.b_U"]


def _tl3_init(model: Model) -> None:
    """Initialise ``model`` exactly as HookedTransformer's GPT-2 scheme would from the same global
    RNG state: ``N(0, initializer_range)`` for every ``W_*`` in its parameter order, gains one,
    biases zero. A seed then gives the same model under both versions. (Gated MLPs, whose native
    layout differs, keep the native initialisation.)"""
    cfg, state = model.cfg, portable_state(model)
    order = _tl3_order(cfg)
    if cfg.gated_mlp or set(order) != set(state) or cfg.init_mode != "gpt2":
        return
    for name in order:
        leaf = name.rsplit(".", 1)[-1]
        t = state[name]
        if leaf.startswith("W_"):
            state[name] = torch.empty(t.shape, dtype=t.dtype).normal_(0.0, cfg.initializer_range)
        else:
            state[name] = torch.ones_like(t) if leaf == "w" else torch.zeros_like(t)
    load_portable_state(model, state)


def _compatible(model: Model, **processing: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.enable_compatibility_mode(disable_warnings=True, **processing)


def config_of(model: Model) -> dict[str, Any]:
    """The portable fields of ``model``'s config (dtype as a ``torch.dtype``)."""
    return {k: getattr(model.cfg, k) for k in PORTABLE_FIELDS if hasattr(model.cfg, k)}


def with_dtype(model: Model, dtype: torch.dtype) -> Model:
    """A fresh, uninitialised-then-loaded copy of ``model`` in ``dtype`` (the caller copies modes)."""
    fields = config_of(model) | {"dtype": dtype, "device": "cpu"}
    copy = build_model(make_config(**fields))
    load_portable_state(copy, {k: v.to(dtype) if v.is_floating_point() else v for k, v in portable_state(model).items()})
    return copy


# --- the one checkpoint format ------------------------------------------------------------------

_HT_BUFFERS = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")


def _rotary_perm(model_or_cfg: Any) -> torch.Tensor | None:
    """Native dim ``2i`` holds HookedTransformer dim ``i``, ``2i + 1`` holds ``i + r/2`` (first ``r = rotary_dim``)."""
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if TL_MAJOR < 4 or cfg.positional_embedding_type != "rotary":
        return None
    r = cfg.rotary_dim or cfg.d_head
    half = torch.arange(r // 2)
    perm = torch.stack([half, half + r // 2], dim=1).flatten()
    return torch.cat([perm, torch.arange(r, cfg.d_head)])


def portable_state(model: Model) -> dict[str, torch.Tensor]:
    """``model``'s parameters under HookedTransformer's names and shapes (no buffers).

    >>> from rs_interp import make_attn_only
    >>> sorted(portable_state(make_attn_only(1)))[:3]
    ['blocks.0.attn.W_K', 'blocks.0.attn.W_O', 'blocks.0.attn.W_Q']
    """
    if TL_MAJOR < 4:
        return {k: v for k, v in model.state_dict().items() if not k.endswith(_HT_BUFFERS)}
    cfg, out = model.cfg, {}
    perm = _rotary_perm(model)
    inverse = None if perm is None else torch.argsort(perm)
    out["embed.W_E"] = model.W_E
    if cfg.positional_embedding_type == "standard":
        out["pos_embed.W_pos"] = model.W_pos
    for l, block in enumerate(model.blocks):
        attn = block.attn
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            t = getattr(attn, name)
            if inverse is not None and name in ("W_Q", "W_K", "b_Q", "b_K"):
                t = t[..., inverse]
            out[f"blocks.{l}.attn.{name}"] = t
        norms = ["ln1"] + ([] if cfg.attn_only else ["ln2"])
        for ln in norms:
            out.update(_norm_state(getattr(block, ln), f"blocks.{l}.{ln}"))
        if not cfg.attn_only:
            for name in ("W_in", "b_in", "W_out", "b_out") + (("W_gate",) if cfg.gated_mlp else ()):
                out[f"blocks.{l}.mlp.{name}"] = getattr(block.mlp, name)
    out.update(_norm_state(model.ln_final, "ln_final"))
    out["unembed.W_U"] = model.W_U
    out["unembed.b_U"] = model.b_U
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def _norm_state(norm: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    inner = getattr(norm, "original_component", norm)
    out = {}
    if getattr(inner, "weight", None) is not None:
        out[f"{prefix}.w"] = inner.weight
    if getattr(inner, "bias", None) is not None:
        out[f"{prefix}.b"] = inner.bias
    return out


def expected_keys(model: Model) -> dict[str, tuple[int, ...]]:
    """The portable parameter names of ``model`` and their shapes."""
    return {k: tuple(v.shape) for k, v in portable_state(model).items()}


def load_portable_state(model: Model, state: dict[str, torch.Tensor]) -> None:
    """Load a HookedTransformer-format state dict (buffers optional) into ``model``, in place.

    Raises:
        ValueError: on 4.x, a nonzero unembedding bias (the native bridge has none).
    """
    state = {k: v for k, v in state.items() if not k.endswith(_HT_BUFFERS)}
    if TL_MAJOR < 4:
        missing = model.load_state_dict(state, strict=False).missing_keys
        params = {k for k in missing if not k.endswith(_HT_BUFFERS)}
        if params:
            raise ValueError(f"missing parameters {sorted(params)[:5]}")
        return
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    b_U = state.pop("unembed.b_U", None)
    if b_U is not None and bool(b_U.ne(0).any()):
        raise ValueError(f"the unembedding bias is nonzero (max |b_U| {b_U.abs().max().item():.3g}); "
                         f"TransformerLens {TL_VERSION}'s native models have none")
    perm = _rotary_perm(model)
    if perm is not None:
        state = {k: v[..., perm] if k.rsplit(".", 1)[-1] in ("W_Q", "W_K", "b_Q", "b_K") else v for k, v in state.items()}
    converted = convert_tl_checkpoint(state, model.cfg)
    own = model.state_dict()
    converted = {k: v.to(own[k].dtype) for k, v in converted.items()}
    if "unembed.bias" in own and "unembed.bias" not in converted:
        converted["unembed.bias"] = torch.zeros_like(own["unembed.bias"])
    model.load_state_dict(converted, strict=True)


# --- per-head inputs ----------------------------------------------------------------------------

def _native_attention(model: Model) -> bool:
    if TL_MAJOR < 4:
        return False
    return type(model.blocks[0].attn).__name__ == "AttentionBridge"


class _Hook:
    """What an emulated hook function receives as ``hook``: its TransformerLens name."""

    def __init__(self, name: str) -> None:
        self.name = name


def _emulate(model: Model, fwd: Sequence[tuple[Any, Callable]]) -> list[tuple[Any, Callable]]:
    """Translate ``blocks.L.hook_{q,k,v}_input`` hooks for a bridge whose attention has none.

    At ``blocks.L.hook_resid_pre`` the stream is recorded; at ``blocks.L.attn.hook_{q,k,v}`` (the
    per-head projection, before rotary) the per-head input ``(batch, pos, head, d_model)`` is
    formed from it, passed to the user's hook, normalised by the block's ``ln1`` and projected per
    head, replacing the projection. The output is the same function of the (possibly replaced)
    input as HookedTransformer's; the replacement runs first, so other hooks on ``hook_{q,k,v}``
    see it.
    """
    wanted: dict[tuple[int, str], list[Callable]] = {}
    out: list[tuple[Any, Callable]] = []
    for name, fn in fwd:
        parts = name.split(".") if isinstance(name, str) else []
        if len(parts) == 3 and parts[0] == "blocks" and parts[2] in ("hook_q_input", "hook_k_input", "hook_v_input"):
            wanted.setdefault((int(parts[1]), parts[2][5]), []).append(fn)
        else:
            out.append((name, fn))
    stream: dict[int, torch.Tensor] = {}
    for layer in sorted({l for l, _ in wanted}):
        def keep(x: torch.Tensor, *, hook: Any, layer: int = layer) -> None:
            stream[layer] = x

        out.insert(0, (f"blocks.{layer}.hook_resid_pre", keep))
    first = [(f"blocks.{layer}.attn.hook_{which}", _projection(model, layer, which, fns, stream))
             for (layer, which), fns in wanted.items()]
    return first + out


def _projection(model: Model, layer: int, which: str, fns: list[Callable], stream: dict[int, torch.Tensor]) -> Callable:
    block, H = model.blocks[layer], model.cfg.n_heads
    name = f"blocks.{layer}.hook_{which}_input"

    def fn(projected: torch.Tensor, *, hook: Any) -> torch.Tensor:
        x = stream[layer].unsqueeze(-2).repeat(1, 1, H, 1)  # (batch, pos, head, d_model)
        for user in fns:
            result = user(x, hook=_Hook(name))
            x = x if result is None else result
        W = getattr(block.attn, f"W_{which.upper()}")  # (head, d_model, d_head), native layout
        b = getattr(block.attn, f"b_{which.upper()}")
        y = torch.einsum("bphm,hmd->bphd", _normalise(model, block.ln1, x), W.to(x.dtype)) + b.to(x.dtype)
        return y.to(projected.dtype)

    return fn


def _normalise(model: Model, norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """HookedTransformer's normalisation of ``x`` in its own dtype, without firing ``norm``'s hooks."""
    kind = model.cfg.normalization_type
    if kind is None:
        return x
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    x = x / (x.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
    inner = getattr(norm, "original_component", norm)
    if kind in ("LN", "RMS"):
        x = x * inner.weight.to(x.dtype)
    if kind == "LN":
        x = x + inner.bias.to(x.dtype)
    return x


@contextlib.contextmanager
def per_head_inputs(model: Model, fwd: Sequence[tuple[Any, Callable]]) -> Iterator[list[tuple[Any, Callable]]]:
    """Hooks runnable on ``model`` from hooks that may name ``blocks.L.hook_{q,k,v}_input``.

    Where the model has those hooks (3.x, and 4.x bridges over Hugging Face attention) the split
    input is switched on for the duration and restored; on native 4.x attention they are emulated
    (see :func:`_emulate`). Hooks on other names pass through unchanged.
    """
    if not _native_attention(model):
        saved = model.cfg.use_split_qkv_input
        model.cfg.use_split_qkv_input = True
        try:
            yield list(fwd)
        finally:
            model.cfg.use_split_qkv_input = saved
        return
    yield _emulate(model, fwd)


# --- running part of the model ------------------------------------------------------------------

class _Stop(Exception):
    """Raised from a hook to end a forward pass once what is wanted has been recorded."""


def run_from(model: Model, x: torch.Tensor, *, start: int | None = None, stop: int | None = None,
             spe: torch.Tensor | None = None) -> torch.Tensor:
    """``model(x, start_at_layer=start, stop_at_layer=stop)``: the logits, or the stream before block ``stop``.

    ``spe`` is the shortformer positional embedding (3.x only). The 4.3 bridge returns the logits
    for ``stop_at_layer=n_layers``; the stream after the last block is then recorded by a hook and
    the pass ended there, so the unembedding is skipped as in 3.x.
    """
    kwargs: dict[str, Any] = {} if start is None else {"start_at_layer": start}
    if spe is not None:
        kwargs["shortformer_pos_embed"] = spe
    if stop is None:
        return model(x, return_type="logits", **kwargs)
    if TL_MAJOR < 4 or stop < model.cfg.n_layers:
        return model(x, stop_at_layer=stop, **kwargs)
    box: dict[str, torch.Tensor] = {}

    def grab(t: torch.Tensor, *, hook: Any) -> None:
        box["x"] = t
        raise _Stop

    try:
        with model.hooks(fwd_hooks=[(f"blocks.{model.cfg.n_layers - 1}.hook_resid_post", grab)]):
            model(x, **kwargs)
    except _Stop:
        pass
    return box["x"]


def score_hooks(model: Model, layer: int, box: dict[str, torch.Tensor], key: str) -> list[tuple[str, Callable]]:
    """Hooks that record layer ``layer``'s pre-softmax scores (batch, head, query, key), ``-inf``
    above the diagonal, in ``box[key]``.

    3.x: ``hook_attn_scores``. On 4.3 native attention that hook holds the pattern, so the scores
    are formed from ``hook_q`` and ``hook_k`` (rotated as the layer rotates them) when the pattern is taken.
    """
    if not _native_attention(model):
        def keep(t: torch.Tensor, *, hook: Any) -> None:
            box[key] = t.detach()

        return [(f"blocks.{layer}.attn.hook_attn_scores", keep)]
    parts: dict[str, torch.Tensor] = {}

    def grab(name: str) -> Callable:
        def fn(t: torch.Tensor, *, hook: Any) -> None:
            parts[name] = t.detach()
        return fn

    def scores(t: torch.Tensor, *, hook: Any) -> None:
        q, k = parts["q"], parts["k"]
        if model.cfg.positional_embedding_type == "rotary":
            q, k = apply_rotary(model, layer, q), apply_rotary(model, layer, k)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / attn_scale(model, layer)
        n = s.shape[-1]
        box[key] = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))

    a = f"blocks.{layer}.attn"
    return [(f"{a}.hook_q", grab("q")), (f"{a}.hook_k", grab("k")), (f"{a}.hook_pattern", scores)]


# --- rotary, biases ----------------------------------------------------------------------------

def apply_rotary(model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (batch, pos, head, d_head), queries or keys at positions ``0 .. pos-1``, as layer ``layer`` does."""
    attn = model.blocks[layer].attn
    if TL_MAJOR < 4:
        return attn.apply_rotary(x)
    rotary = attn.original_component.rotary
    y, _ = rotary.apply_rope(x.transpose(1, 2), x.transpose(1, 2))
    return y.transpose(1, 2)


def attn_scale(model: Model, layer: int) -> float:
    """What layer ``layer`` divides its attention scores by (``sqrt(d_head)`` unless the config says otherwise)."""
    attn = model.blocks[layer].attn
    if TL_MAJOR < 4:
        return float(attn.attn_scale)
    scale = getattr(getattr(attn, "original_component", None), "scale", None)
    return float(scale) if scale is not None else math.sqrt(model.cfg.d_head)


def bias_parameters(model: Model, names: Sequence[str]) -> list[torch.nn.Parameter]:
    """The parameters behind HookedTransformer's bias names (``"b_V"``, ``"b_O"``, ``"b_U"``) in every layer."""
    if TL_MAJOR < 4:
        return [p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in names]
    out = []
    for block in model.blocks:
        for name in names:
            if name in ("b_V", "b_O", "b_Q", "b_K"):
                out.append(getattr(block.attn, name[-1].lower()).original_component.bias)
    if "b_U" in names:
        bias = getattr(model.unembed.original_component, "bias", None)
        if isinstance(bias, torch.nn.Parameter):
            out.append(bias)
    return out


# --- modules called directly (the theory lab's post-LN stack) -------------------------------------

def attention_output(model: Model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Layer ``layer``'s attention applied to ``x`` as query, key and value input (batch, pos, d_model)."""
    attn = model.blocks[layer].attn
    out = attn(x, x, x) if TL_MAJOR < 4 else attn(x)
    return out[0] if isinstance(out, tuple) else out


def mlp_out_parameter(model: Model, layer: int) -> torch.nn.Parameter:
    """The parameter behind layer ``layer``'s ``W_out`` (4.x stores it transposed: the same entries)."""
    mlp = model.blocks[layer].mlp
    return mlp.W_out if TL_MAJOR < 4 else mlp.out.original_component.weight


def set_unembedding(model: Model, W_U: torch.Tensor) -> None:
    """Overwrite ``W_U`` (d_model, d_vocab) in place."""
    with torch.no_grad():
        if TL_MAJOR < 4:
            model.unembed.W_U.copy_(W_U)
        else:
            model.unembed.original_component.weight.copy_(W_U.T)


# --- GPT-2 --------------------------------------------------------------------------------------

def _folded(model: Model, fold_ln: bool) -> Model:
    """After folding, 4.x keeps ``normalization_type="LN"`` with unit gains and zero biases; say
    ``"LNPre"`` as 3.x does, so the analyses see no (zero) norm-bias term. The forward pass is unchanged."""
    if fold_ln and model.cfg.normalization_type == "LN":
        norms = [b.ln1 for b in model.blocks] + [b.ln2 for b in model.blocks if hasattr(b, "ln2")] + [model.ln_final]
        if all(bool((n.w == 1).all()) and not bool(n.b.any()) for n in norms):
            model.cfg.normalization_type = "LNPre"
    return model


def gpt2_from_hf_dir(path: str, cfg: ModelConfig, *, fold_ln: bool, center_writing_weights: bool,
                     center_unembed: bool, dtype: torch.dtype) -> Model:
    """GPT-2 from a local Hugging Face checkpoint directory, no network call."""
    if TL_MAJOR >= 4:
        model = Model.boot_transformers(str(path), device="cpu", dtype=dtype)
        _compatible(model, fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed)
        return _folded(model, fold_ln)
    from transformers import GPT2LMHeadModel
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    hf_model = GPT2LMHeadModel.from_pretrained(str(path), local_files_only=True)
    state = convert_gpt2_weights(hf_model, cfg)
    model = build_model(cfg)
    model.load_and_process_state_dict(state, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                      center_unembed=center_unembed)
    return model


def gpt2_from_hub(name: str, *, fold_ln: bool, center_writing_weights: bool, center_unembed: bool,
                  dtype: torch.dtype) -> Model:
    """GPT-2 from the Hugging Face hub or cache."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        if TL_MAJOR >= 4:
            model = Model.boot_transformers(name, device="cpu", dtype=dtype)
            _compatible(model, fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=center_unembed)
            return _folded(model, fold_ln)
        return Model.from_pretrained(name, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
                                     center_unembed=center_unembed, dtype=dtype, device="cpu")
