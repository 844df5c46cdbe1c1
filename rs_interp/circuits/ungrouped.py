"""Grouped-query attention ungrouped, as MIB's circuit track scores it.

Under grouped-query attention, query heads ``h`` with ``h // (H / G) = g`` share key/value head
``g``. rs_interp's graph (:func:`rs_interp.edge_layout`) has one key and one value input per KV head,
``L{l}KV{g}.k`` / ``.v``; MIB's (EAP-IG's ``Graph`` on TransformerLens's
``ungroup_grouped_query_attention``) gives every query head its own copy of that input,
``a{l}.h{h}<k>``, scored and kept on its own: cutting the copy of head ``h`` changes the keys (or
values) head ``h`` reads and no other head's, so a circuit may keep part of a KV group.

:func:`ungroup_gqa` makes that model: a copy whose attention is multi-head, ``W_K``, ``b_K``,
``W_V``, ``b_V`` of query head ``h`` being KV head ``h // (H / G)``'s,

    K_h = ln1(x) W_K[g(h)] + b_K[g(h)],   V_h likewise,

so every run computes what the grouped model computes (tested to float rounding), while its edge
graph has one key and one value input per query head. Every method then runs on it unchanged: EAP
and EAP-IG score each copy as MIB does (the gradient at head ``h``'s own input), a faithfulness
curve keeps partial KV groups at a budget as MIB's does (each copy one edge), and MIB's importance
files of GQA models, whose copies differ, read onto it (:func:`rs_interp.circuits.read_mib`). On the
grouped model each KV edge's score is the sum of its copies' scores (first order, exactly).

>>> import rs_interp as ri
>>> model = ri.models.make_attn_only(1, n_heads=4, n_key_value_heads=2, d_head=8, d_model=32)
>>> flat = ungroup_gqa(model)
>>> ri.edge_layout(model).receivers[4:6], ri.edge_layout(flat).receivers[:3]
(('L0KV0.k', 'L0KV0.v'), ('L0H0.q', 'L0H0.k', 'L0H0.v'))
"""

from __future__ import annotations

from .. import _backend
from .._backend import Model, kv_groups

__all__ = ["ungroup_gqa"]


def ungroup_gqa(model: Model) -> Model:
    """A copy of a grouped-query attention model with one key and one value per query head (module
    docstring): the same function, MIB's graph of it.

    Raises:
        ValueError: not a TransformerLens model; a model without grouped-query attention; a model
            whose weights have no portable form here (a Hugging Face-booted bridge on
            TransformerLens 4.x: load it on 3.x).

    Example:
        >>> import rs_interp as ri, torch
        >>> model = ri.models.make_attn_only(2, n_heads=4, n_key_value_heads=2, d_head=8, d_model=32)
        >>> flat = ungroup_gqa(model)
        >>> tokens = torch.tensor([[1, 2, 3, 4]])
        >>> flat.cfg.n_key_value_heads, bool(torch.allclose(flat(tokens), model(tokens), atol=1e-5))
        (None, True)
    """
    if not _backend.is_model(model):
        raise ValueError(f"model must be a TransformerLens model, got {type(model).__name__}")
    cfg = model.cfg
    G, H = kv_groups(cfg), cfg.n_heads
    if G == H:
        raise ValueError("this model has no grouped-query attention "
                         f"(n_key_value_heads={getattr(cfg, 'n_key_value_heads', None)}, n_heads={H}): its graph "
                         "already has one key and one value input per head")
    state = _backend.portable_state(model)  # raises for a Hugging Face-booted 4.x bridge it cannot hold
    per = H // G
    out = {}
    for name, value in state.items():
        base = name.rsplit(".", 1)
        if len(base) == 2 and base[1].lstrip("_") in _backend.KV_WEIGHTS and ".attn." in name:
            kv = value.repeat_interleave(per, dim=0) if value.shape[0] == G else value
            out[f"{base[0]}.{base[1].lstrip('_')}"] = kv
        else:
            out[name] = value
    fields = _backend.config_of(model) | {"n_key_value_heads": None, "device": "cpu"}
    copy = _backend.build_model(_backend.make_config(**fields))
    _backend.load_portable_state(copy, out)
    device = next(model.parameters()).device
    if device.type != "cpu":
        copy.to(device)
    if model.tokenizer is not None:
        _backend.set_tokenizer(copy, model.tokenizer)
    for mine, theirs in zip(copy.modules(), model.modules()):
        mine.training = theirs.training
    return copy
