"""Labels (rs_interp.labels): every label the module builds is read back by ``parse`` to its parts, and the readers
the other packages call instead of their own regexes and splits (issue 65: ``node_label``, ``kind_of``, ``count_of``)
agree with the builders on every kind of component."""

from __future__ import annotations

import pytest

from rs_interp.labels import (
    EMBED,
    LOGITS,
    Component,
    count_of,
    head_label,
    kind_of,
    kv_label,
    mlp_label,
    node_label,
    parse,
    receiver_label,
)


@pytest.mark.parametrize("layer, index", [(0, 0), (3, 11), (12, 7)])
def test_every_built_label_parses_back_to_its_parts(layer, index):
    assert parse(head_label(layer, index)) == Component("head", layer, index, None)
    assert parse(kv_label(layer, index)) == Component("kv_head", layer, index, None)
    assert parse(mlp_label(layer)) == Component("mlp", layer, None, None)
    for x in "qkv":
        assert parse(receiver_label(layer, index, x)) == Component("head", layer, index, x)
        assert node_label(receiver_label(layer, index, x)) == head_label(layer, index)
    for x in "kv":
        assert parse(receiver_label(layer, index, x, kv=True)) == Component("kv_head", layer, index, x)
        assert node_label(receiver_label(layer, index, x, kv=True)) == kv_label(layer, index)


def test_node_label_and_kind_of_on_the_other_labels():
    for label, kind in [(EMBED, "embed"), ("tok_embed", "embed"), ("pos_embed", "embed"), (LOGITS, "logits"),
                        ("MLP4", "mlp"), ("L2H1", "head"), ("L2KV0.v", "kv_head")]:
        assert kind_of(label) == kind
        assert node_label(label) == label.partition(".")[0]


@pytest.mark.parametrize("bad", ["L0KV0.q", "L0H1.x", "MLP", "mlp0", "L0", "H0", "", "embed.q"])
def test_a_label_that_names_nothing_is_refused(bad):
    """A key/value head has no query input; anything that is not a label is a ValueError naming it."""
    for reader in (parse, node_label, kind_of):
        with pytest.raises(ValueError, match="not a sender or receiver label"):
            reader(bad)


@pytest.mark.parametrize("n_layers, n_heads, n_kv", [(1, 4, 4), (3, 4, 2), (2, 6, 1)])
def test_count_of_counts_a_layouts_heads_per_layer(n_layers, n_heads, n_kv):
    """As edge_layout lays a model out: per layer each head's q (and k, v without grouping), each key/value
    head's k and v under grouped-query attention, the MLP; the logits last."""
    receivers, senders = [], [EMBED]
    for l in range(n_layers):
        senders += [head_label(l, h) for h in range(n_heads)] + [mlp_label(l)]
        if n_kv == n_heads:
            receivers += [receiver_label(l, h, x) for h in range(n_heads) for x in "qkv"]
        else:
            receivers += [receiver_label(l, h, "q") for h in range(n_heads)]
            receivers += [receiver_label(l, g, x, kv=True) for g in range(n_kv) for x in "kv"]
        receivers.append(mlp_label(l))
    receivers.append(LOGITS)
    for l in range(n_layers):
        assert count_of(senders, "head", layer=l) == n_heads
        assert count_of(receivers, "head", layer=l, input="q") == n_heads
        assert count_of(receivers, "kv_head", layer=l, input="k") == (0 if n_kv == n_heads else n_kv)
        assert count_of(receivers, "mlp", layer=l) == 1
    assert count_of(receivers, "head", layer=n_layers) == 0
