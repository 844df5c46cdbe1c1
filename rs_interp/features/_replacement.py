"""The local replacement model, shared by the graph and the interventions (private).

Under the freezes of circuit-tracer's replacement model, every attention pattern and every norm's
scale is held at its value in the clean run, and every MLP's output is held at its clean value
(except through the transcoders' linear skips into it: its own layer's and, in a cross-layer transcoder, earlier
layers', :meth:`~rs_interp.features.TranscoderSet.skips_into`): the map from the token embeddings and the MLP
outputs to every transcoder input and to the final stream is then *linear*. Two ways of running it:

- :func:`grad_forward`: the model's own forward pass with the patterns and scales detached and each
  MLP output cut from its input (``skip + (out - skip).detach()``, ``skip`` the skips' write from this run's
  inputs): a backward pass from a transcoder input (or the final stream) then gives that linear map's transpose,
  exactly;
- :func:`frozen_forward`: the model's own forward pass with the patterns and scales *replaced* by
  their clean values and each MLP output replaced by what the caller says: an intervention in the
  frozen model (linear in what is changed, so a graph entry predicts it exactly).

Both read hooks every TransformerLens version has (``attn.hook_pattern``, ``ln*.hook_scale``,
``ln2.hook_normalized`` or ``hook_resid_mid``, ``hook_mlp_out``, ``hook_embed``, ``unembed.hook_in``).

On post-norm blocks (Gemma-2/3, OLMo-2) the scales frozen include those of the norms after the attention
and the MLP (``ln1_post.hook_scale``, ``ln2_post.hook_scale``), so a head's write is its frozen-scale write
(:mod:`rs_interp.exact.postnorm`), and a transcoder replaces the MLP with its norm after it: it writes at
``hook_mlp_out``, what enters the stream (circuit-tracer's Gemma-2 transcoders write there too).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from .. import _names as N
from .._backend import Model, Stop, mlp_norm_name, pattern_after_attention, pre_norm, with_dtype
from .._messages import few
from .._state import frozen, preserve_state
from ..exact.certificate import require
from .transcoders import TranscoderSet

__all__: list[str] = []

def check_replacement(model: Model, transcoders: TranscoderSet, what: str) -> None:
    """Refuse, naming why, a model whose replacement is not linear once frozen (the configurations of
    :data:`rs_interp.exact.certificate.REFUSES`, then the identities the graph needs, measured on the model:
    :data:`rs_interp.exact.certificate.NEEDS`), or transcoders that do not fit it. ``what`` is the helper's
    public name (``"features.attribution_graph"`` ...)."""
    cfg = model.cfg
    # The configurations no identity can make exact, then the identities, measured on the model (hooks included).
    require(model, what, also=("mlp weights",) if transcoders.scan.endswith("-mlp-neurons") else ())
    if len(transcoders) != cfg.n_layers:
        raise ValueError(f"{what}: {len(transcoders)} transcoders for {cfg.n_layers} layers (one per layer)")
    if transcoders[0].d_model != cfg.d_model:
        raise ValueError(f"{what}: the transcoders read d_model={transcoders[0].d_model}, the model has {cfg.d_model}")
    if transcoders.input_point == "ln2.hook_normalized" and cfg.normalization_type is None:
        raise ValueError(f"{what}: the transcoders read ln2.hook_normalized, and the model has no normalization")
    missing = [n for n in hook_names(model, transcoders) if n not in model.hook_dict]
    if missing:
        raise ValueError(f"{what}: the model lacks the hook points {few(missing)} "
                         "(a Hugging Face-booted bridge of another layout?)")


def working_copy(model: Model) -> Model:
    """The model itself, or a float32 copy of a float16/bfloat16 one (long sums of half-precision terms lose
    the identities the graph promises; as elsewhere in rs_interp, half models are computed in float32)."""
    if model.cfg.dtype not in (torch.float16, torch.bfloat16):
        return model
    return with_dtype(model, torch.float32).eval()


def working_set(transcoders: TranscoderSet, dtype: torch.dtype) -> TranscoderSet:
    """The transcoders in the model's dtype, as normal tensors (a set loaded under ``torch.inference_mode``
    holds inference tensors, which autograd cannot save): the set itself when it already is."""
    if transcoders.dtype == dtype and not any(p.is_inference() for tc in transcoders for p in tc.parameters()):
        return transcoders
    return transcoders.to(dtype)


def input_hook(model: Model, transcoders: TranscoderSet, layer: int) -> str:
    """The hook point the transcoder input of ``layer`` is read from (see :func:`finish_input`): the normalised
    stream of the norm the MLP reads through, ``ln2`` or, on a parallel block with one shared input norm, ``ln1``
    (its scale frozen with every other, the MLP's input is then linear in ``resid_pre``:
    :func:`rs_interp._backend.mlp_norm_name`)."""
    point = transcoders.input_point
    if point == "hook_resid_mid":
        return N.resid_mid(layer)
    # the stream itself (a parallel MLP's: resid_pre)
    if point == "mlp.hook_in" and pre_norm(model, layer, "ln2").kind is None:
        return N.resid_pre(layer) if getattr(model.cfg, "parallel_attn_mlp", False) else N.resid_mid(layer)
    return N.normalized(layer, mlp_norm_name(model, layer))


def finish_input(model: Model, transcoders: TranscoderSet, layer: int, t: torch.Tensor) -> torch.Tensor:
    """The transcoder input from :func:`input_hook`'s tensor: TransformerLens's ``hook_normalized``
    precedes the norm's gain and bias, which the MLP's input has (the gain as the model applies it:
    :func:`rs_interp._backend.norm_of`; the certificate's ``mlp reads`` checks it is what the MLP reads)."""
    norm = pre_norm(model, layer, "ln2")  # the identity on a post-norm block with none before its MLP (OLMo-2)
    if transcoders.input_point != "mlp.hook_in" or norm.kind is None:
        return t
    return norm.affine(t)


def freeze_names(model: Model) -> list[str]:
    """Every attention pattern and every norm scale: what circuit-tracer's replacement model freezes."""
    return [n for n in model.hook_dict if n.endswith(("attn.hook_pattern", "hook_scale"))]


def hook_names(model: Model, transcoders: TranscoderSet) -> list[str]:
    L = model.cfg.n_layers
    return ([N.EMBED, N.UNEMBED_IN] + [input_hook(model, transcoders, l) for l in range(L)]
            + [N.mlp_out(l) for l in range(L)] + [N.pattern(l) for l in range(L)])


def mlp_hooks(model: Model, transcoders: TranscoderSet, at_input: Callable[[int], Callable],
              at_output: Callable[[int], Callable]) -> list[tuple[str, Callable]]:
    """What every pass of the replacement model hooks per layer: ``at_input(l)`` at the transcoder's input
    point (:func:`input_hook`), ``at_output(l)`` at ``hook_mlp_out`` (where the transcoder writes)."""
    return [h for l in range(model.cfg.n_layers)
            for h in ((input_hook(model, transcoders, l), at_input(l)), (N.mlp_out(l), at_output(l)))]


def pattern_hooks(model: Model, patterns: dict[str, torch.Tensor]) -> list[tuple[str, Callable]]:
    """Hooks putting ``patterns`` (by ``attn.hook_pattern`` name, batch 1) back where an edit at ``hook_pattern`` is
    discarded (:func:`rs_interp._backend.pattern_after_attention`): ``hook_z`` set to ``pattern v``, ``v`` this run's
    ``hook_v`` (so only ``v`` carries a gradient)."""
    hooks: list[tuple[str, Callable]] = []
    for l in range(model.cfg.n_layers):
        name = N.pattern(l)
        if name not in patterns or not pattern_after_attention(model, l):
            continue
        box: dict[str, torch.Tensor] = {}

        def z(t: torch.Tensor, hook, box=box, A=patterns[name]) -> torch.Tensor:
            v = box["v"]
            return torch.einsum("bhqk,bkhd->bqhd", A.to(v.dtype).expand(v.shape[0], -1, -1, -1), v)
        hooks += [(N.v(l), lambda t, hook, box=box: box.__setitem__("v", t)), (N.z(l), z)]
    return hooks


@contextlib.contextmanager
def quiet_model(model: Model) -> Iterator[None]:
    """Eval mode and no parameter gradients for the duration (the backward passes need input
    gradients only); every flag restored as found, also on errors (:func:`rs_interp._state.preserve_state`,
    :func:`rs_interp._state.frozen`)."""
    with preserve_state(model), frozen(model):
        yield


@dataclass(frozen=True)
class Clean:
    """One clean run of one prompt: what the freezes hold and what the graph's nodes are made of.

    Attributes:
        inputs, outputs: per layer, the transcoder input and the MLP output, (pos, d_model).
        frozen: every pattern and norm scale, by hook name (batch 1).
        embed: (pos, d_model) the token embeddings (``hook_embed``).
        logits: (pos, d_vocab).
    """

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    frozen: dict[str, torch.Tensor]
    embed: torch.Tensor
    logits: torch.Tensor


def _store(box: dict, key: str, fn: Callable[[torch.Tensor], torch.Tensor] = lambda t: t):
    def hook(t: torch.Tensor, hook) -> None:
        box[key] = fn(t).detach().clone()
    return hook


def clean_run(model: Model, transcoders: TranscoderSet, tokens: torch.Tensor) -> Clean:
    """Record one prompt's clean run (``tokens`` (1, pos))."""
    box: dict[str, torch.Tensor] = {}
    L = model.cfg.n_layers
    hooks = [(n, _store(box, n)) for n in freeze_names(model)] + [(N.EMBED, _store(box, "embed"))]
    hooks += mlp_hooks(model, transcoders,
                       lambda l: _store(box, f"in{l}", lambda t: finish_input(model, transcoders, l, t)),
                       lambda l: _store(box, f"out{l}"))
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(tokens, return_type="logits")
    frozen = {n: box[n] for n in freeze_names(model)}
    return Clean(tuple(box[f"in{l}"][0] for l in range(L)), tuple(box[f"out{l}"][0] for l in range(L)), frozen,
                 box["embed"][0], logits[0].detach())


def frozen_forward(model: Model, transcoders: TranscoderSet, clean: Clean, tokens: torch.Tensor, *,
                   outputs: Callable[[int, list[torch.Tensor]], torch.Tensor],
                   embed: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Run the frozen model: patterns and scales at their clean values, the token embeddings
    ``embed`` (pos, d_model; default the clean ones), and layer ``l``'s MLP output
    ``outputs(l, xs)`` for the transcoder inputs ``xs`` of layers ``0..l`` in this run. Returns the transcoder
    inputs (per layer, (pos, d_model)) and the logits (pos, d_vocab)."""
    box: dict[str, torch.Tensor] = {}

    def freeze(t: torch.Tensor, hook) -> torch.Tensor:
        return clean.frozen[hook.name].to(t.dtype)

    def set_out(l: int):  # the full shape: a broadcast (a bias alone) breaks a model's in-place add after it (Falcon's)
        return lambda t, hook: torch.zeros_like(t) + outputs(l, [box[f"in{i}"] for i in range(l + 1)])[None].to(t.dtype)

    # there, hook_pattern's edit would be discarded (and warned)
    routed = {n for n, _ in pattern_hooks(model, clean.frozen)}
    is_pattern = N.every(N.pattern)
    hooks = [(n, freeze) for n in clean.frozen if not (is_pattern(n) and N.z(N.layer_of(n)) in routed)]
    hooks += pattern_hooks(model, clean.frozen)
    if embed is not None:
        hooks.append((N.EMBED, lambda t, hook: embed[None].to(t.dtype)))
    hooks += mlp_hooks(model, transcoders,
                       lambda l: lambda t, hook: box.__setitem__(f"in{l}", finish_input(model, transcoders, l, t)[0]),
                       set_out)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(tokens, return_type="logits")
    return [box[f"in{l}"] for l in range(model.cfg.n_layers)], logits[0]


@dataclass
class GradRun:
    """The tensors of a :func:`grad_forward` run, each (batch, pos, d_model), in one autograd graph."""

    inputs: list[torch.Tensor]   # transcoder inputs, per layer: where a feature target reads
    outputs: list[torch.Tensor]  # MLP outputs, per layer: where features and errors write
    embed: torch.Tensor          # token embeddings: where token nodes write
    final: torch.Tensor          # the final normalized stream (unembed input): where logits read
    captured: dict[str, torch.Tensor]  # the tensors at the hook points asked for (``capture``), by name


def grad_forward(model: Model, transcoders: TranscoderSet, tokens: torch.Tensor, capture: tuple[str, ...] = (),
                 patterns: dict[str, torch.Tensor] | None = None) -> GradRun:
    """The forward pass whose backward is the frozen replacement model's transpose (module docstring).
    ``tokens`` (batch, pos): one row per target of a backward batch (the rows are the same prompt);
    ``capture``: hook points (before the unembedding) whose tensors to keep, e.g. a layer's ``attn.hook_q``;
    ``patterns``: the clean run's (:attr:`Clean.frozen`), put back where ``hook_pattern`` cannot detach them
    (:func:`pattern_hooks`).
    Call inside :func:`quiet_model` with gradients enabled."""
    box: dict[str, torch.Tensor] = {}
    L = model.cfg.n_layers

    def detach(t: torch.Tensor, hook) -> torch.Tensor:
        return t.detach()

    def embed(t: torch.Tensor, hook) -> torch.Tensor:
        box["embed"] = t.detach().requires_grad_(True)
        return box["embed"]

    def read(l: int):
        def hook(t: torch.Tensor, hook) -> None:
            box[f"in{l}"] = finish_input(model, transcoders, l, t)
        return hook

    def cut(l: int):
        def hook(t: torch.Tensor, hook) -> torch.Tensor:
            skips = transcoders.skips_into(l)
            if not skips:
                out = t.detach().requires_grad_(True)  # a leaf: the MLP's output, cut from its input
            else:  # the skips read this run's inputs (this layer's, and earlier ones' in a cross-layer transcoder)
                xs = {src: box[f"in{src}"].to(transcoders.dtype) for src, _ in skips}
                s = transcoders.skip_into(l, xs).to(t.dtype)
                out = s + (t - s).detach()  # only the skips' linear paths stay
            box[f"out{l}"] = out
            return out
        return hook

    def final(t: torch.Tensor, hook) -> None:
        box["final"] = t
        raise Stop  # the logits are not needed: the unembedding of a batch is the costliest matmul

    def keep(t: torch.Tensor, hook) -> torch.Tensor:
        box[hook.name] = t * 1  # returned: the run goes on from this very tensor (4.x's hook_z is a copy otherwise)
        return box[hook.name]

    hooks = [(n, detach) for n in freeze_names(model)] + [(N.EMBED, embed), (N.UNEMBED_IN, final)]
    hooks += pattern_hooks(model, patterns or {})
    hooks += mlp_hooks(model, transcoders, read, cut)
    # the MLP's own output is cut: nothing inside it needs a gradient, so none of its activations is kept for one
    hooks += [(n, detach) for n in model.hook_dict if n.endswith(("mlp.hook_pre", "mlp.hook_pre_linear"))]
    hooks += [(n, keep) for n in capture]
    with model.hooks(fwd_hooks=hooks):
        try:
            model(tokens, return_type="logits")
        except Stop:
            pass
    return GradRun([box[f"in{l}"] for l in range(L)], [box[f"out{l}"] for l in range(L)], box["embed"], box["final"],
                   {n: box[n] for n in capture})
