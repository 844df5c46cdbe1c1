"""TransformerLens 4.x bridges whose readers of the stream are not the edge graph's receivers, routed
through them: what :mod:`.tl4` wires on a Hugging Face-booted bridge. Each workaround says when it can go.

The edge graph's receivers are each head's q, k and v inputs, each MLP's input (``hook_mlp_in``, the
stream before the MLP's norm) and the final stream (:mod:`rs_interp.exact.stream`). Their gradients add
up to the stream's only if nothing else reads the stream (the certificate's ``readers``). On 4.3 three
kinds of bridge read it elsewhere:

- *a shared input norm* (parallel blocks with one norm, GPT-J, Phi, Cohere, Falcon): the MLP reads
  ``ln1(resid_pre)``, the very tensor the attention reads, and the block has no ``ln2`` for
  TransformerLens to fire ``hook_mlp_in`` at, so it never fires. Routed (:class:`SharedNormMLP`): with
  ``use_hook_mlp_in`` on, the MLP's input is ``ln1(hook_mlp_in(resid_pre))``, the norm applied by
  :class:`rs_interp.exact.norm.Norm` (the one the certificate checks the model's against), so a value
  added to ``hook_mlp_in`` reaches the MLP alone and the MLP's gradient is read there;
- *a block that skips TransformerLens's capture wiring* (BLOOM: ``BloomBlockBridge.forward`` never calls
  it), so ``hook_mlp_in`` never fires and the attention's split-input fork sees the normalised stream
  (its ``hook_q_input`` is ``ln1``'s output, not the stream). Routed: ``hook_mlp_in`` fired at ``ln2``'s
  input as TransformerLens fires it on every other block (:class:`MLPInAtNorm`), and the per-head inputs
  emulated (:func:`emulates_inputs`);
- *attention with no split-input fork* (GPT-J, GPT-Neo, OPT: a plain ``AttentionBridge`` over the
  Hugging Face module's own q, k, v projections): per-head inputs emulated as on native attention
  (:func:`rs_interp._backend.emulation.qkv_input_hooks`), the projection replaced at ``hook_{q,k,v}``
  before anything after it (rotary, the score) runs.

And one reads a head's input into every head's query: *a query or key norm spanning the heads* (OLMo-2, OLMoE),
applied by the fork to the concatenation of each head's own projection. Routed (:func:`spanning_norms`,
:func:`seen_head_inputs`): each head's own copy of the norm (:mod:`.head_copies`).

Two bridges also hide where an MLP reads and writes (the certificate's ``mlp reads``/``mlp writes`` and the
feature graph read them; :func:`mlp_modules`):

- *a container never called* (OPT: the decoder layer runs ``fc1``/``fc2`` itself, on the stream flattened to
  (batch * pos, d_model)): the MLP's input is ``fc1``'s (``mlp.in``), its output ``fc2``'s (``mlp.out``,
  whose ``hook_out`` is ``hook_mlp_out``); and ``ln2.hook_scale``/``ln2.hook_normalized``, which
  TransformerLens leaves flattened, are given the block's own unflattening (:func:`wire`), so every hook of
  the MLP's norm sees (batch, pos, ...) as on every other block (a view: the same numbers);
- *an MLP whose module adds the residual* (BLOOM: ``BloomMLP.forward(hidden, residual)`` returns
  ``dropout_add(dense_4h_to_h(...), residual)``): its own write is ``dense_4h_to_h``'s output (``mlp.out``,
  whose ``hook_out`` is ``hook_mlp_out``), the stream's add after it the block's.

The hooks are objects of this module (their state is deep-copied with the model: ``as_dtype``'s copies
route through their own modules) and act only while ``use_hook_mlp_in`` is on, which rs_interp's
helpers switch on for the call; off, the model runs as booted.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import torch
from transformer_lens.hook_points import HookPoint
from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
from transformer_lens.model_bridge.generalized_components.bloom_block import BloomBlockBridge
from transformer_lens.model_bridge.generalized_components.bloom_mlp import BloomMLPBridge
from transformer_lens.model_bridge.generalized_components.linear import LinearBridge

from .._norm import Norm
from . import head_copies
from ._tl4_native import has_split_inputs, is_native_attention

__all__: list[str] = []

#: Blocks whose forward skips TransformerLens's capture wiring (``_maybe_wire_capture_hooks``): no
#: ``hook_mlp_in``, and the split-input fork sees ``ln1``'s output. Remove when: TransformerLens >= 4.4
#: (or whichever release first does) wires them in ``BloomBlockBridge.forward``.
_UNWIRED_BLOCKS = (BloomBlockBridge,)

#: MLPs whose module's output is the stream after the MLP (its residual added inside: BLOOM's). Remove when:
#: TransformerLens >= 4.4 (or whichever release first does) gives the module's output without the residual.
_RESIDUAL_MLPS = (BloomMLPBridge,)

#: The modules whose PyTorch hooks are a bridge's own wiring, not a user's (:func:`rs_interp._backend.is_own_hook`).
OWN_HOOK_MODULES = ("transformer_lens.model_bridge", "transformers.utils.output_capturing", __name__)


def emulates_inputs(model: Any, layer: int) -> bool:
    """Whether rs_interp emulates layer ``layer``'s per-head q/k/v inputs: on native attention (as before), and
    on a Hugging Face attention with separate q, k and v projections (``LinearBridge``s, whose outputs are
    ``hook_q``, ``hook_k``, ``hook_v``), one key and value per query head, and no split-input fork that reads
    the stream (none at all: GPT-J, GPT-Neo, OPT; or one its block leaves without the stream: BLOOM)."""
    if is_native_attention(model, layer):
        return True
    block, cfg = model.blocks[layer], model.cfg
    if not all(isinstance(block.attn._modules.get(x), LinearBridge) for x in "qkv"):
        return False
    if (getattr(cfg, "n_key_value_heads", None) or cfg.n_heads) != cfg.n_heads:
        return False  # grouped: the emulation projects one input per query head
    return not has_split_inputs(model, layer) or isinstance(block, _UNWIRED_BLOCKS)


def pattern_after_attention(model: Any, layer: int) -> bool:
    """Whether layer ``layer``'s attention fires ``attn.hook_pattern`` only after the Hugging Face module has used the
    pattern (GPT-Neo, GPT-J on 4.3: a plain ``AttentionBridge`` that hands the whole attention to the module; an edit
    there is discarded, with TransformerLens's warning), so a pattern is put back through ``attn.hook_z``
    instead, ``z = pattern v`` (:mod:`rs_interp.features._replacement`). Remove when: TransformerLens >= 4.4 (or
    whichever release first does) runs those modules' pattern through ``hook_pattern`` (``accepts_pattern_fn``)."""
    attn = model.blocks[layer].attn
    if is_native_attention(model, layer) or type(attn).forward is not AttentionBridge.forward:
        return False
    return not getattr(getattr(attn, "original_component", None), "accepts_pattern_fn", False)


def mlp_modules(model: Any, layer: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(reads, writes)``: the module whose input is layer ``layer``'s MLP input and the one whose output is the
    MLP's own write (module docstring): the MLP bridge itself, except where its container is never called (OPT:
    ``mlp.in``, ``mlp.out``) or its output holds the residual (BLOOM: the bridge, ``mlp.out``). Their tensors may
    be flattened to (batch * pos, ...) (OPT's). Remove when: TransformerLens >= 4.4 (or whichever release
    first does) calls the MLP container and keeps the residual out of its output."""
    mlp = model.blocks[layer].mlp
    if getattr(mlp, "name", "") is None and all(isinstance(mlp._modules.get(x), LinearBridge) for x in ("in", "out")):
        return mlp._modules["in"], mlp._modules["out"]  # containerless (``MLPBridge(name=None)``): never called
    if isinstance(mlp, _RESIDUAL_MLPS) and isinstance(mlp._modules.get("out"), LinearBridge):
        return mlp, mlp._modules["out"]
    return mlp, mlp


def _unflatten_norm(block: torch.nn.Module) -> None:
    """Give the hook points of ``block``'s ``ln2`` that TransformerLens leaves flattened (OPT's ``hook_scale``,
    ``hook_normalized``: (batch * pos, ...)) the block's own unflattening conversion, the one its ``hook_mlp_in``
    has (stamped with (batch, pos) at each forward: a view, the same numbers). Remove when: TransformerLens
    >= 4.4 (or whichever release first does) attaches it to every hook of OPT's flattened region."""
    conversion = getattr(block.hook_mlp_in, "hook_conversion", None)
    if conversion is None or not hasattr(conversion, "batch_seq") or "ln2" not in block._modules:
        return
    for point in block._modules["ln2"].modules():
        if isinstance(point, HookPoint) and point.hook_conversion is None:
            point.hook_conversion = conversion


class MLPInAtNorm:
    """A forward pre-hook on a block's ``ln2``: its input through the block's ``hook_mlp_in`` while
    ``use_hook_mlp_in`` is on (what TransformerLens's own wiring does on the blocks it wires)."""

    def __init__(self, block: torch.nn.Module, cfg: Any) -> None:
        self.block, self.cfg = block, cfg

    def __call__(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        if not self.cfg.use_hook_mlp_in or not args or not isinstance(args[0], torch.Tensor):
            return None
        return (self.block.hook_mlp_in(args[0]),) + args[1:]


class SharedNormMLP:
    """The MLP of a parallel block with one input norm, read through ``hook_mlp_in`` (module docstring):
    ``ln1``'s input recorded by a pre-hook on ``ln1`` (:meth:`record`), and the MLP's input replaced by a
    pre-hook on the MLP (:meth:`route`) with ``ln1(hook_mlp_in(resid_pre))`` while ``use_hook_mlp_in`` is on,
    the norm read from ``ln1`` as it is then (``norm_affine``: :func:`rs_interp._backend.norm_affine`) and
    computed in float32 at least, as the per-head inputs' (:func:`.emulation.normalise`)."""

    def __init__(self, model: Any, block: torch.nn.Module,
                 norm_affine: Callable[[Any, torch.nn.Module], tuple]) -> None:
        self.model, self.block, self.norm_affine = model, block, norm_affine
        self.stream: torch.Tensor | None = None

    def __getstate__(self) -> dict:
        """Copied (``as_dtype``'s deep copy) without the stream of a pass in flight (a tensor of the graph)."""
        return {**self.__dict__, "stream": None}

    def record(self, module: torch.nn.Module, args: tuple) -> None:
        if self.model.cfg.use_hook_mlp_in and args and isinstance(args[0], torch.Tensor):
            self.stream = args[0]

    def route(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        if not self.model.cfg.use_hook_mlp_in or self.stream is None:
            return None
        x, self.stream = self.block.hook_mlp_in(self.stream), None
        high = x if x.dtype in (torch.float32, torch.float64) else x.float()
        norm = Norm(*self.norm_affine(self.model, self.block.ln1)).to(high.dtype)
        return (norm.apply(high).to(args[0].dtype),) + args[1:]


def wire(model: Any, norm_affine: Callable[[Any, torch.nn.Module], tuple]) -> Any:
    """Route ``model``'s extra readers through the receivers (module docstring), in place; returns ``model``.
    ``norm_affine(model, module)`` reads a norm as the model computes it (:func:`rs_interp._backend.norm_affine`).
    Called once, after booting."""
    for block in model.blocks:
        subs = block._modules
        if "hook_mlp_in" in subs:
            _unflatten_norm(block)
        if "mlp" not in subs or getattr(block, "mlp_reads_resid_directly", False):
            continue
        if "ln2" in subs and isinstance(block, _UNWIRED_BLOCKS):
            subs["ln2"].register_forward_pre_hook(MLPInAtNorm(block, model.cfg))
        elif "ln2" not in subs and "ln1" in subs and bool(getattr(model.cfg, "parallel_attn_mlp", False)):
            shared = SharedNormMLP(model, block, norm_affine)
            subs["ln1"].register_forward_pre_hook(shared.record)
            subs["mlp"].register_forward_pre_hook(shared.route)
    return model


def deep_copy(model: Any) -> Any:
    """A deep copy of a booted bridge that computes and routes through its own modules. Two 4.3 wirings are
    mended (Remove when: TransformerLens >= 4.4, or whichever release first does, deep-copies a bridge whole):

    - tensors of the last pass that modules keep (a pattern, a captured stream: not leaves of the graph after
      a pass with gradients, which ``copy.deepcopy`` refuses) are shared, detached, not copied;
    - TransformerLens's capture hooks (closures over the original's attention, wired at the first pass) are
      removed from the copy through its own handles and wired anew at its first pass: a copy kept them
      pointing at the original, so its split-input fork saw no stream (or raised once the original was gone).
    """
    memo: dict[int, Any] = {}
    for module in model.modules():
        for value in module.__dict__.values():
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                memo[id(value)] = value.detach()
    out = copy.deepcopy(model, memo)
    for block in out.blocks:
        if hasattr(block, "_teardown_capture_hooks"):
            block._teardown_capture_hooks()
    return out


def spanning_norms(model: Any) -> list[head_copies.SpanningNorm]:
    """The query and key norms that span the heads (OLMo-2's and OLMoE's ``q_norm``/``k_norm`` over every head's
    ``d_head``, the bridge's ``attn.q_norm``/``attn.k_norm``), each with the Hugging Face projection it follows
    (``q_proj``/``k_proj``) and the bridge's own norm (its ``forward``: the bridge computes the norm itself, in the
    stream's dtype, rather than calling the Hugging Face module)."""
    out = []
    for l, block in enumerate(model.blocks):
        attn = block.attn
        for which in "qk":
            norm, proj = attn._modules.get(f"{which}_norm"), attn._modules.get(which)
            if not head_copies.spans(norm, model.cfg.d_head) or getattr(proj, "original_component", None) is None:
                continue
            linear = proj.original_component

            def project(u: torch.Tensor, linear: torch.nn.Module = linear) -> torch.Tensor:
                return torch.nn.functional.linear(u, linear.weight, linear.bias)

            out.append(head_copies.SpanningNorm(l, which, norm, project, norm.forward))  # forward: no hook on itself
    return out


@contextlib.contextmanager
def seen_head_inputs(model: Any, box: dict) -> Iterator[None]:
    """Record in ``box`` each spanning layer's query and key inputs, (batch, pos, head, d_model) as the bridge's
    split-input fork projects them (after its ``ln1``), by wrapping that bridge's ``_project_per_head_qkv``
    for the block. Remove when: TransformerLens >= 4.4 (or whichever release first does) normalises a query or
    key norm spanning the heads per head under ``use_split_qkv_input`` (then :mod:`.head_copies` goes too)."""
    wrapped = []
    for l in sorted({n.layer for n in spanning_norms(model)}):
        attn = model.blocks[l].attn
        own = attn._project_per_head_qkv
        kinds = {id(attn._modules[x]): x for x in "qk" if x in attn._modules}

        def project(linear_bridge: Any, input_4d: torch.Tensor, *args: Any, own: Callable = own, kinds: dict = kinds,
                    layer: int = l) -> torch.Tensor:
            if id(linear_bridge) in kinds:
                box[(layer, kinds[id(linear_bridge)])] = input_4d
            return own(linear_bridge, input_4d, *args)

        attn.__dict__["_project_per_head_qkv"] = project
        wrapped.append(attn)
    try:
        yield
    finally:
        for attn in wrapped:
            attn.__dict__.pop("_project_per_head_qkv", None)
