"""MIB's names of rs_interp's edges, and where EAP-IG's ``Graph`` keeps them (the names half of
:mod:`rs_interp.circuits.mib_files`, which re-exports :func:`mib_edge_names` and :func:`from_mib_edge`).

Nodes ``input``, ``a{l}.h{h}``, ``m{l}``, ``logits``; an edge ``parent->child``, with ``<q>``/``<k>``/``<v>``
after an attention child; under grouped-query attention one MIB edge per query head's copy of a KV
head's key or value input.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .._backend import kv_groups
from ..labels import head_label, mlp_label, parse, receiver_label

__all__ = ["mib_edge_names", "from_mib_edge"]

_SENDER = re.compile(r"^(?:input|a(\d+)\.h(\d+)|m(\d+))$")
_EDGE = re.compile(r"^(input|a\d+\.h\d+|m\d+)->(a\d+\.h\d+|m\d+|logits)(?:<([qkv])>)?$")


def _mib_node(label: str) -> str:
    """rs_interp's sender or receiver node (no .q/.k/.v) -> MIB's node name."""
    c = parse(label)
    if c.kind in ("embed", "logits"):
        return "input" if c.kind == "embed" else "logits"
    return f"m{c.layer}" if c.kind == "mlp" else f"a{c.layer}.h{c.index}"


def mib_edge_names(edge: tuple[str, str], model_or_cfg: Any) -> list[str]:
    """MIB's names of an rs_interp edge: one, or one per query head of the group for a key or value
    input under grouped-query attention (module docstring).

    Example:
        >>> from rs_interp.models import make_attn_only
        >>> cfg = make_attn_only(1)
        >>> mib_edge_names(("embed", "L0H1.q"), cfg), mib_edge_names(("L0H0", "logits"), cfg)
        (['input->a0.h1<q>'], ['a0.h0->logits'])
        >>> mib_edge_names(("embed", "L0KV0.k"), make_attn_only(1, n_heads=2, n_key_value_heads=1))
        ['input->a0.h0<k>', 'input->a0.h1<k>']
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    sender, receiver = edge
    parent = _mib_node(sender)
    c = parse(receiver)
    if c.input is None:  # the logits or an MLP
        return [f"{parent}->{_mib_node(receiver)}"]
    layer, index, x = c.layer, c.index, c.input
    if c.kind == "kv_head":
        per = cfg.n_heads // kv_groups(cfg)
        return [f"{parent}->a{layer}.h{h}<{x}>" for h in range(index * per, (index + 1) * per)]
    return [f"{parent}->a{layer}.h{index}<{x}>"]


def from_mib_edge(name: str, model_or_cfg: Any) -> tuple[str, str]:
    """The rs_interp edge of a MIB edge name (under grouped-query attention, the KV head's edge).

    Raises:
        ValueError: a name that is not a MIB edge, or not an edge of this model.

    Example:
        >>> import rs_interp as ri
        >>> from_mib_edge("a0.h1->a1.h0<k>", ri.load_toy_model("induction-2l"))
        ('L0H1', 'L1H0.k')
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    m = _EDGE.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a MIB edge name (parent->child, '<q>'/'<k>'/'<v>' after an attention child)")
    parent, child, x = m.groups()
    if child.startswith("a") and x is None:
        raise ValueError(f"{name!r}: an edge into an attention head needs <q>, <k> or <v>")
    if not child.startswith("a") and x is not None:
        raise ValueError(f"{name!r}: only an attention child takes <{x}>")

    def label(node: str) -> str:
        if node in ("input", "logits"):
            return "embed" if node == "input" else "logits"
        if node.startswith("m"):
            return mlp_label(int(node[1:]))
        layer, head = node[1:].split(".h")
        return head_label(int(layer), int(head))

    sender, receiver = label(parent), label(child)
    if x is not None:
        c, kv = parse(receiver), x != "q" and kv_groups(cfg) != cfg.n_heads
        receiver = receiver_label(c.layer, c.index // (cfg.n_heads // kv_groups(cfg)) if kv else c.index, x, kv=kv)
    _check_edge(sender, receiver, cfg)
    return sender, receiver


def _check_edge(sender: str, receiver: str, cfg: Any) -> None:
    """What :meth:`rs_interp.circuits.EdgeLayout.index` checks, from the config alone (no layout built per edge).

    Raises:
        ValueError: a label this model does not have, or a sender that is not upstream of the receiver.
    """
    L, H, G = cfg.n_layers, cfg.n_heads, kv_groups(cfg)
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))

    def depth(label: str, role: str) -> float:
        if label == ("embed" if role == "sender" else "logits"):
            return 0 if role == "sender" else math.inf
        try:
            c = parse(label)
        except ValueError:  # "L0KV0.q" too
            c = None
        head = c is not None and c.kind in ("head", "kv_head") and (c.input is not None) == (role == "receiver")
        if head and c.layer < L and (
                (c.kind == "head" and c.index < H and (role == "sender" or c.input == "q" or G == H))
                or (c.kind == "kv_head" and role == "receiver" and G != H and c.index < G)):
            return 2 * c.layer + 1
        if c is not None and c.kind == "mlp" and not cfg.attn_only and c.layer < L:
            return 2 * c.layer + (1 if parallel else 2)
        raise ValueError(f"{label!r} is not a {role} of this model")

    if not depth(sender, "sender") < depth(receiver, "receiver"):
        raise ValueError(f"({sender!r}, {receiver!r}) is not an edge: {sender} is not upstream of {receiver}")


def _edges(layout: Any) -> list[tuple[str, str]]:
    """``layout.edges()`` (row-major) from one ``nonzero``: a tenth of the time on GPT-2's 70k pairs."""
    return [(layout.senders[i], layout.receivers[j]) for i, j in layout.exists.nonzero().tolist()]


def _cfg_dict(cfg: Any) -> dict:
    return {"n_layers": int(cfg.n_layers), "n_heads": int(cfg.n_heads),
            "parallel_attn_mlp": bool(getattr(cfg, "parallel_attn_mlp", False)), "d_model": int(cfg.d_model)}


def _nodes(cfg: Any) -> list[str]:
    names = ["input"]
    for l in range(cfg.n_layers):
        names += [f"a{l}.h{h}" for h in range(cfg.n_heads)] + ([] if cfg.attn_only else [f"m{l}"])
    return names + ["logits"]


def _eap_index(name: str, cfg: Any) -> tuple[int, int]:
    """(forward, backward) index of a MIB edge in EAP-IG's ``Graph`` matrices (``to_pt``)."""
    parent, child, x = _EDGE.match(name).groups()
    H = cfg.n_heads
    m = _SENDER.match(parent)
    if parent == "input":
        fwd = 0
    elif m.group(3) is not None:
        fwd = 1 + int(m.group(3)) * (H + 1) + H
    else:
        fwd = 1 + int(m.group(1)) * (H + 1) + int(m.group(2))
    if child == "logits":
        bwd = cfg.n_layers * (3 * H + 1)
    elif child.startswith("m"):
        bwd = int(child[1:]) * (3 * H + 1) + 3 * H
    else:
        layer, head = child[1:].split(".h")
        bwd = int(layer) * (3 * H + 1) + "qkv".index(x) * H + int(head)
    return fwd, bwd
