"""Per-head query, key and value inputs on both TransformerLens versions.

TransformerLens's ``blocks.L.hook_q_input`` (``hook_k_input``, ``hook_v_input``) holds the
residual stream that head ``h``'s queries (keys, values) are computed from, ``(batch, pos,
head_index, d_model)``, before ``ln1``: editing head ``h``'s slice changes that head's input
alone. HookedTransformer and TransformerLens 4's bridges over Hugging Face attention with its
split-input fork fire it once ``use_split_qkv_input`` is on; TransformerLens 4.3's native models
(``boot_native``, what rs_interp builds on 4.x) and its bridges over Hugging Face attention without
that fork (GPT-J, GPT-Neo, OPT; BLOOM's block leaves it without the stream) list the names but never
fire them. :func:`split_qkv_inputs` gives the same hooks the same effect on every model.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

from rs_interp._backend import per_head_inputs

__all__ = ["split_qkv_inputs"]


@contextlib.contextmanager
def split_qkv_inputs(model: Any, fwd_hooks: Sequence[tuple[str | Callable[[str], bool], Callable]]) -> Iterator[Any]:
    """Apply ``fwd_hooks`` for the duration, with ``blocks.L.hook_{q,k,v}_input`` working on every model.

    Use it where you would use ``model.hooks(fwd_hooks=...)``. On TransformerLens 3.x (and 4.x
    bridges whose attention has the split inputs) the flag ``use_split_qkv_input`` is switched on
    through the model's setter and restored afterwards. On 4.x native attention (and the Hugging Face
    attention above) the per-head inputs are emulated: formed from the stream entering ``ln1``, passed to your hooks,
    normalised and projected per head in place of the model's own projection, giving
    HookedTransformer's numbers; your hooks on ``attn.hook_{q,k,v}`` and on ``ln1``'s
    ``hook_scale``/``hook_normalized`` act as on 3.x. A query or key norm spanning the heads (OLMo-2's,
    OLMoE's) is applied to each head's own copy, so editing head ``h``'s slice moves head ``h``'s query
    (key) alone, ``slice_h(q_norm(x' W_Q))`` (TransformerLens's own split normalises the heads' concatenation:
    one head's edit would move them all). Other hooks pass through unchanged;
    nothing stays attached afterwards, also when the body raises.

    Args:
        model: a TransformerLens model (HookedTransformer, or a TransformerBridge in
            compatibility mode).
        fwd_hooks: ``(name or name filter, fn)`` pairs, as for ``model.hooks``.

    Yields:
        ``model``, hooked.

    Raises:
        ValueError: a hooked layer's attention has no per-head inputs and none are emulated (a 4.x
            bridge over Hugging Face attention with a joint or grouped projection and no fork).
        NotImplementedError: grouped-query attention on a native 4.x model.

    >>> import torch
    >>> from rs_interp.models import make_attn_only
    >>> from rs_interp.hooks import replace_heads
    >>> model, tokens = make_attn_only(2, seed=0), torch.randint(0, 256, (1, 8))
    >>> zero = torch.zeros(1, 8, 32)  # head 0 of layer 1 reads its keys from a zero stream
    >>> with split_qkv_inputs(model, [("blocks.1.hook_k_input", replace_heads(zero, [0]))]):
    ...     patched = model(tokens)
    >>> bool((patched - model(tokens)).abs().max() > 0), model.cfg.use_split_qkv_input
    (True, False)
    """
    with per_head_inputs(model, fwd_hooks) as runnable, model.hooks(fwd_hooks=runnable):
        yield model
