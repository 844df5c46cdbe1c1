"""Labels: one way to name every component, built and parsed here and nowhere else.

Every result, table, figure and file names components with these labels (the vocabulary table of
the docs lists them):

- a head ``"L{l}H{h}"``; a key/value head under grouped-query attention ``"L{l}KV{g}"``;
- an MLP ``"MLP{l}"``;
- a receiver (an input that reads the residual stream) ``"L{l}H{h}.q"`` / ``.k`` / ``.v``
  (``"L{l}KV{g}.k"`` / ``.v`` under grouped-query attention), ``"MLP{l}"``, ``"logits"``;
- a sender (a component that writes the stream) ``"embed"`` (the stream entering block 0: the token
  embedding plus any learned position embedding), a head, an MLP;
- an edge, the pair ``(sender, receiver)`` (a tuple, everywhere);
- a constant term of a decomposition, by its parameter: ``"W_E"`` (the token embedding alone),
  ``"W_pos"``, ``"b_O L{l}"``, ``"ln_final.b"``, ``"b_U"``, ``"ln1.b"``, ``"b_V"``;
- a reading point of the lenses: ``"embed"``, ``"L{l} attn"`` (after block ``l``'s attention),
  ``"L{l}"`` (after block ``l``).

>>> head_label(1, 0), mlp_label(2), receiver_label(1, 0, "k"), receiver_label(1, 0, "k", kv=True)
('L1H0', 'MLP2', 'L1H0.k', 'L1KV0.k')
>>> parse("L1KV0.v")
Component(kind='kv_head', layer=1, index=0, input='v')
>>> parse("MLP3"), parse("logits")
(Component(kind='mlp', layer=3, index=None, input=None), Component(kind='logits', layer=None, index=None, input=None))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

__all__ = [
    "Component",
    "head_label",
    "head_labels",
    "kv_label",
    "mlp_label",
    "receiver_label",
    "bias_label",
    "lens_label",
    "edge_string",
    "parse",
    "node_label",
    "kind_of",
    "count_of",
    "EMBED",
    "LOGITS",
]

#: The sender that is the stream entering block 0.
EMBED = "embed"
#: The receiver that is the final stream, read by the unembedding.
LOGITS = "logits"

_HEAD = re.compile(r"^L(\d+)(H|KV)(\d+)(?:\.([qkv]))?$")
_MLP = re.compile(r"^MLP(\d+)$")


@dataclass(frozen=True)
class Component:
    """What a label names.

    Attributes:
        kind: ``"embed"``, ``"head"``, ``"kv_head"``, ``"mlp"`` or ``"logits"``.
        layer: the layer (None for ``embed`` and ``logits``).
        index: the head or key/value head within its layer (None otherwise).
        input: ``"q"``, ``"k"`` or ``"v"`` for a head's input (a receiver), else None.
    """

    kind: str
    layer: int | None
    index: int | None
    input: str | None


def head_label(layer: int, head: int) -> str:
    """The label of head ``(layer, head)``: ``"L{layer}H{head}"``.

    >>> head_label(0, 1)
    'L0H1'
    """
    return f"L{int(layer)}H{int(head)}"


def head_labels(n_layers: int, n_heads: int) -> tuple[str, ...]:
    """Every head's :func:`head_label`, row-major: the order of a flattened (layer, head) tensor.

    >>> head_labels(2, 2)
    ('L0H0', 'L0H1', 'L1H0', 'L1H1')
    """
    return tuple(head_label(l, h) for l in range(n_layers) for h in range(n_heads))


def kv_label(layer: int, group: int) -> str:
    """The label of key/value head ``group`` of ``layer`` (grouped-query attention): ``"L{layer}KV{group}"``.

    >>> kv_label(2, 1)
    'L2KV1'
    """
    return f"L{int(layer)}KV{int(group)}"


def mlp_label(layer: int) -> str:
    """The label of layer ``layer``'s MLP: ``"MLP{layer}"``.

    >>> mlp_label(0)
    'MLP0'
    """
    return f"MLP{int(layer)}"


def receiver_label(layer: int, head: int, which: str, *, kv: bool = False) -> str:
    """The label of a head's input ``which`` (``"q"``, ``"k"`` or ``"v"``); with ``kv=True``, of key/value
    head ``head`` (grouped-query attention).

    Raises:
        ValueError: ``which`` is not ``"q"``, ``"k"`` or ``"v"``, or ``kv=True`` with ``"q"``.

    >>> receiver_label(0, 1, "q")
    'L0H1.q'
    """
    if which not in ("q", "k", "v"):
        raise ValueError(f"a head's input is 'q', 'k' or 'v', got {which!r}")
    if kv and which == "q":
        raise ValueError("queries are per query head: a key/value head has no 'q' input")
    return f"{kv_label(layer, head) if kv else head_label(layer, head)}.{which}"


def bias_label(layer: int) -> str:
    """The label of layer ``layer``'s attention output bias ``b_O`` as a term of a decomposition: ``"b_O L{layer}"``.

    >>> bias_label(1)
    'b_O L1'
    """
    return f"b_O L{int(layer)}"


def lens_label(layer: int | None, *, sublayer: str | None = None) -> str:
    """The label of a lens reading point: ``"embed"`` (``layer=None``), ``"L{l}"`` after block ``l``,
    ``"L{l} attn"`` after its attention (``sublayer="attn"``).

    >>> lens_label(None), lens_label(0), lens_label(0, sublayer="attn")
    ('embed', 'L0', 'L0 attn')
    """
    if layer is None:
        return EMBED
    if sublayer not in (None, "attn"):
        raise ValueError(f"sublayer must be None or 'attn', got {sublayer!r}")
    return f"L{int(layer)}" + ("" if sublayer is None else f" {sublayer}")


def edge_string(edge: tuple[str, str]) -> str:
    """An edge written out for a table or a figure's hover text: ``"L0H1 -> L1H0.k"``.

    >>> edge_string(("embed", "logits"))
    'embed -> logits'
    """
    sender, receiver = edge
    return f"{sender} -> {receiver}"


def parse(label: str) -> Component:
    """What a sender or receiver label names.

    Raises:
        ValueError: not a sender or receiver label.

    >>> parse("L0H1.q")
    Component(kind='head', layer=0, index=1, input='q')
    """
    if label in (EMBED, "tok_embed", "pos_embed"):  # the summed input, or its two parts (edge_layout's embedding=)
        return Component("embed", None, None, None)
    if label == LOGITS:
        return Component("logits", None, None, None)
    if isinstance(label, str) and (m := _HEAD.match(label)):
        kind = "head" if m.group(2) == "H" else "kv_head"
        if kind == "kv_head" and m.group(4) == "q":  # bare, "L0KV0" names the key/value head itself (kv_label)
            raise ValueError(f"not a sender or receiver label: {label!r} (a key/value head is read as .k or .v)")
        return Component(kind, int(m.group(1)), int(m.group(3)), m.group(4))
    if isinstance(label, str) and (m := _MLP.match(label)):
        return Component("mlp", int(m.group(1)), None, None)
    raise ValueError(f"not a sender or receiver label: {label!r}")


def node_label(label: str) -> str:
    """The component a receiver belongs to, its input dropped (``"L1H0.k"`` -> ``"L1H0"``); any other sender or
    receiver label (``"MLP1"``, ``"logits"``, ``"embed"``) unchanged.

    >>> node_label("L1KV0.k"), node_label("MLP1"), node_label("logits")
    ('L1KV0', 'MLP1', 'logits')
    """
    c = parse(label)
    return label.partition(".")[0] if c.input is not None else label


def kind_of(label: str) -> str:
    """:func:`parse`'s ``kind`` of a sender or receiver label: ``"embed"``, ``"head"``, ``"kv_head"``, ``"mlp"`` or
    ``"logits"``.

    >>> kind_of("L0H1.q"), kind_of("MLP2"), kind_of("embed")
    ('head', 'mlp', 'embed')
    """
    return parse(label).kind


def count_of(labels: Iterable[str], kind: str, *, layer: int, input: str | None = None) -> int:
    """How many of ``labels`` name a component of ``kind`` in ``layer`` (reading ``input``, when given): a layout's
    query heads per layer, ``count_of(layout.receivers, "head", layer=0, input="q")``.

    >>> count_of(["embed", "L0H0", "L0H1", "MLP0", "L1H0"], "head", layer=0)
    2
    >>> count_of(["L0H0.q", "L0H1.q", "L0KV0.k", "L0KV0.v", "logits"], "kv_head", layer=0, input="k")
    1
    """
    return sum(1 for s in labels if (c := parse(s)).kind == kind and c.layer == layer and input in (None, c.input))
