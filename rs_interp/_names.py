"""The hook-point names rs_interp reads, written once (TransformerLens's names, which both versions keep
in compatibility mode). A helper asks for ``names.z(l)``, never spells ``f"blocks.{l}.attn.hook_z"``.

>>> resid_pre(0), z(1), qkv_input(1, "k"), scale(0, "ln1")
('blocks.0.hook_resid_pre', 'blocks.1.attn.hook_z', 'blocks.1.hook_k_input', 'blocks.0.ln1.hook_scale')
"""

from __future__ import annotations

from typing import Callable

__all__ = [
    "EMBED", "POS_EMBED", "UNEMBED_IN", "RESID0", "block", "resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_in",
    "mlp_out", "z", "q", "k", "v", "pattern", "scores", "projection", "qkv_input", "normalized", "scale", "mlp_post",
    "final_stream", "layer_of", "in_block", "norm_input", "every", "MLP_HOOK_IN", "RESID_MID", "LN2_NORMALIZED",
    "MLP_HOOK_OUT", "MLP_OUT", "TRANSCODER_INPUTS", "TRANSCODER_OUTPUTS",
]

EMBED = "hook_embed"
POS_EMBED = "hook_pos_embed"
UNEMBED_IN = "unembed.hook_in"
#: The stream entering block 0 (what the ``embed`` sender writes).
RESID0 = "blocks.0.hook_resid_pre"

#: Where a transcoder reads and writes, by the hook's path inside a block (circuit-tracer's ``feature_input_hook``
#: and ``feature_output_hook``): the MLP's input after the second norm, the stream before that norm, the norm before
#: its gain; the MLP's output, under its two names.
MLP_HOOK_IN = "mlp.hook_in"
RESID_MID = "hook_resid_mid"
LN2_NORMALIZED = "ln2.hook_normalized"
MLP_HOOK_OUT = "mlp.hook_out"
MLP_OUT = "hook_mlp_out"
TRANSCODER_INPUTS = (MLP_HOOK_IN, RESID_MID, LN2_NORMALIZED)
TRANSCODER_OUTPUTS = (MLP_HOOK_OUT, MLP_OUT)


def block(l: int) -> str:
    return f"blocks.{l}."


def in_block(l: int, path: str) -> str:
    """``blocks.l.<path>``: what block ``l`` holds, by its path inside the block (a module, a hook point,
    or a parameter: HookedTransformer's state-dict key, ``in_block(0, "attn.W_Q")``)."""
    return f"blocks.{l}.{path}"


def resid_pre(l: int) -> str:
    return f"blocks.{l}.hook_resid_pre"


def resid_mid(l: int) -> str:
    return f"blocks.{l}.hook_resid_mid"


def resid_post(l: int) -> str:
    return f"blocks.{l}.hook_resid_post"


def attn_out(l: int) -> str:
    return f"blocks.{l}.hook_attn_out"


def mlp_in(l: int) -> str:
    return f"blocks.{l}.hook_mlp_in"


def mlp_out(l: int) -> str:
    return f"blocks.{l}.hook_mlp_out"


def mlp_post(l: int) -> str:
    return f"blocks.{l}.mlp.hook_post"


def z(l: int) -> str:
    return f"blocks.{l}.attn.hook_z"


def projection(l: int, which: str) -> str:
    """``blocks.l.attn.hook_{q,k,v}``: a head's query, key or value (batch, pos, head, d_head)."""
    return f"blocks.{l}.attn.hook_{which}"


def q(l: int) -> str:
    return projection(l, "q")


def k(l: int) -> str:
    return projection(l, "k")


def v(l: int) -> str:
    return projection(l, "v")


def pattern(l: int) -> str:
    return f"blocks.{l}.attn.hook_pattern"


def scores(l: int) -> str:
    return f"blocks.{l}.attn.hook_attn_scores"


def qkv_input(l: int, which: str) -> str:
    """``blocks.l.hook_{q,k,v}_input``: a head's own copy of the stream it reads (batch, pos, head, d_model)."""
    return f"blocks.{l}.hook_{which}_input"


def normalized(l: int, norm: str) -> str:
    """``blocks.l.{ln1,ln2}.hook_normalized``: ``c(x) / s(x)`` before the gain and bias."""
    return f"blocks.{l}.{norm}.hook_normalized"


def norm_input(l: int, norm: str) -> str:
    """``blocks.l.{ln1,ln2}.hook_in``: what enters a block's norm (TransformerLens 4's bridge)."""
    return f"blocks.{l}.{norm}.hook_in"


def scale(l: int, norm: str) -> str:
    return f"blocks.{l}.{norm}.hook_scale"


def final_stream(n_layers: int) -> str:
    """The final stream the unembedding reads (through the final norm): the last block's ``hook_resid_post``."""
    return resid_post(n_layers - 1)


def layer_of(name: str) -> int | None:
    """The layer a ``blocks.L. ...`` name belongs to, else None.

    >>> layer_of("blocks.3.attn.hook_z"), layer_of("hook_embed")
    (3, None)
    """
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() else None


def every(*points: str | Callable[[int], str]) -> Callable[[str], bool]:
    """A name filter true on each of ``points``: a name, or one of this module's functions of the layer
    (true on ``point(l)`` for every layer ``l``); for :func:`rs_interp.hooks.store_matching` and ``fwd_hooks``.

    >>> is_z = every(z)
    >>> is_z("blocks.2.attn.hook_z"), is_z("blocks.2.attn.hook_q"), is_z("hook_embed")
    (True, False, False)
    >>> every(EMBED, pattern)("hook_embed"), every(EMBED, pattern)("blocks.0.attn.hook_pattern")
    (True, True)
    """
    names = {p for p in points if isinstance(p, str)}
    per_layer = [p for p in points if not isinstance(p, str)]

    def matches(name: str) -> bool:
        if name in names:
            return True
        l = layer_of(name)
        return l is not None and any(name == point(l) for point in per_layer)

    return matches
