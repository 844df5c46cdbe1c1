"""What the tests build and share, importable (``from builders import make_variant``): the variant
grid (every norm, positional scheme, MLPs or not, parallel, grouped-query, qk-norm, gated MLPs), the
perturbation that makes every bias and gain nonzero, a first LayerNorm written apart from the library,
version marks and the cross-version records. ``conftest.py`` holds the session fixtures and reads these.
"""

from __future__ import annotations

import pytest
import torch

from rs_interp import _backend

#: TransformerLens 4's models are native bridges: standard and rotary positions only. Tests of what
#: only 3.x can build are marked with this.
TL4 = _backend.TL_MAJOR >= 4
needs_tl3 = pytest.mark.skipif(TL4, reason=f"TransformerLens {_backend.TL_VERSION}'s native models have no shortformer or alibi positions (3.x only)")


def tl3_only(why: str):
    """Skip on TransformerLens 4, saying what 4.x lacks."""
    return pytest.mark.skipif(TL4, reason=f"TransformerLens {_backend.TL_VERSION}: {why} (checked on 3.x)")


def slow_on_tl3(why: str):
    """A slow test that runs under 3.x only: ``scripts/test.sh`` runs the slow tests once, under 4.x,
    except these (marked ``tl3``), which its 3.x pass selects."""

    def mark(fn):
        return pytest.mark.slow(pytest.mark.tl3(tl3_only(why)(fn)))

    return mark


def other_version_record(name: str, mine: dict):
    """Record this TransformerLens version's numbers ``mine`` as ``name`` in ``RS_INTERP_CROSS_DIR``
    and return the other version's record of the same name, or skip saying why.

    ``scripts/test.sh`` runs the two versions side by side: both passes run the recording tests
    (marked ``cross_version``) first, and the 4.x pass, given ``RS_INTERP_CROSS_WAIT`` (seconds), waits that long for the 3.x
    record (and fails, naming it, if none comes). Records are written whole (a rename), so a waiting
    reader never loads half a file."""
    import os
    import time
    from pathlib import Path

    cross = os.environ.get("RS_INTERP_CROSS_DIR")
    if cross is None:
        pytest.skip("RS_INTERP_CROSS_DIR is unset: scripts/test.sh sets it and runs both TransformerLens versions")
    folder = Path(cross)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}_tl{_backend.TL_MAJOR}.pt"
    torch.save(mine, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    other = folder / f"{name}_tl{7 - _backend.TL_MAJOR}.pt"  # 3 <-> 4
    wait = os.environ.get("RS_INTERP_CROSS_WAIT")
    deadline = time.monotonic() + float(wait or 0)
    while not other.is_file() and time.monotonic() < deadline:
        time.sleep(2)
    if not other.is_file():
        if wait:
            pytest.fail(f"the other TransformerLens version's pass wrote no {other.name} in {cross} within RS_INTERP_CROSS_WAIT={wait} s")
        pytest.skip(f"no record from the other TransformerLens version in {cross} yet (this run wrote its own)")
    return torch.load(other)


def ln1_by_hand(model, layer, x):
    """Layer ``layer``'s first normalisation, written out from the config (apart from the library):
    the brute forces of the patching tests recompute a head's q/k/v from a moved input with it."""
    kind, ln = model.cfg.normalization_type, model.blocks[layer].ln1
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    if kind is not None:
        x = x / (x.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
    if kind in ("LN", "RMS"):
        x = x * ln.w
    return x + ln.b if kind == "LN" else x


def perturb(model, seed, *, bias_scale=0.2):
    """Every bias nonzero (N(0, bias_scale)) and every gain in [0.5, 1.5], through the portable
    state dict so the same names serve both TransformerLens versions. ``b_U`` stays zero on 4.x (the 4.x
    suite's numbers were measured without it; a native model with one is tested in tests/integration/test_architectures.py), and
    so do a gated MLP's biases (4.x's native gated MLPs have none)."""
    state = _backend.portable_state(model)
    gated = bool(getattr(model.cfg, "gated_mlp", False))
    g = torch.Generator().manual_seed(seed)
    # Sorted names: both versions draw the same numbers for the same parameter (their state dicts
    # come in different orders); "unembed.b_U", skipped on 4.x, sorts last and shifts no other draw.
    for name, p in sorted(state.items()):
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "w":
            state[name] = torch.rand(p.shape, generator=g, dtype=torch.float64).to(p.dtype) + 0.5
        elif leaf.startswith("b") and not (TL4 and (leaf == "b_U" or (gated and ".mlp." in name))):
            state[name] = (bias_scale * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(p.dtype)
    _backend.load_portable_state(model, state)
    return model


NORMALIZATIONS = ("LN", "LNPre", "RMS", "RMSPre", None)
POSITIONS = ("standard", "rotary") + (() if TL4 else ("shortformer", "alibi"))


#: What each architecture feature of :data:`ARCHITECTURES` sets (grouped-query: one KV head, valid for any n_heads).
FEATURES = {None: {}, "parallel": dict(parallel_attn_mlp=True), "gqa": dict(n_key_value_heads=1),
            "qk_norm": dict(use_qk_norm=True), "gated": dict(gated_mlp=True, act_fn="silu")}


def make_variant(norm, pos, attn_only, feature=None, *, dtype=torch.float64, seed=0, n_layers=2, n_heads=2, d_head=8,
                 d_model=16, d_vocab=50, n_ctx=12, **overrides):
    """A small random model of any TransformerLens variant, with every bias and gain nonzero; ``feature``
    adds one of :data:`FEATURES` (parallel blocks, grouped-query attention, qk-norm, gated SiLU MLPs);
    ``overrides`` set any other config field (``act_fn="relu"`` ...)."""
    from rs_interp.models.checkpoints import build_model

    fields = dict(
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_head, d_vocab=d_vocab, n_ctx=n_ctx,
        attn_only=attn_only, d_mlp=None if attn_only else 4 * d_model, act_fn=None if attn_only else "gelu",
        normalization_type=norm, positional_embedding_type=pos, rotary_dim=d_head if pos == "rotary" else None,
        dtype=dtype, seed=None, device="cpu")
    cfg = _backend.make_config(**{**fields, **FEATURES[feature], **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(cfg)
    return perturb(model, seed).eval()


VARIANTS = [(n, p, a) for n in NORMALIZATIONS for p in POSITIONS for a in (True, False)]

#: The grid's extension by architecture (issue 29): parallel blocks, grouped-query attention and
#: qk-norm, and gated (SiLU) MLPs, each on a norm and positions TransformerLens models pair it with. TransformerLens 4.3's
#: native models build grouped-query attention only; its parallel and qk-norm models are Hugging
#: Face-booted (tests/integration/test_pretrained.py).
ARCHITECTURES = [("LN", "rotary", False, "parallel"), ("RMS", "rotary", False, "gqa"), ("LNPre", "standard", True, "gqa"),
                 ("RMS", "rotary", False, "qk_norm"), ("RMS", "rotary", False, "gated")]


def architecture_params(variants=tuple(ARCHITECTURES)):
    """:data:`ARCHITECTURES` as pytest params, those 4.x's native models cannot build skipped there."""
    skip = lambda v: TL4 and v[3] in ("parallel", "qk_norm")  # noqa: E731
    why = lambda v: (f"TransformerLens {_backend.TL_VERSION}'s native models do not build {v[3]} "  # noqa: E731
                     "(its Hugging Face-booted families are tested in tests/integration/test_pretrained.py)")
    return [pytest.param(v, id=variant_id(v), marks=pytest.mark.skipif(skip(v), reason=why(v)))
            for v in variants]


def variant_id(v) -> str:
    n, p, a, *feature = v
    return f"{n or 'none'}-{p}-{'attn' if a else 'mlp'}" + "".join(f"-{f}" for f in feature)


def skipping_targets(model, toks, seed=7):
    """Random targets with about a third of the positions skipped (-1), and the skip mask."""
    g = torch.Generator().manual_seed(seed)
    tg = torch.randint(0, model.cfg.d_vocab, toks.shape, generator=g)
    skip = torch.rand(toks.shape, generator=g) < 0.35
    skip[0, 0], skip[0, 1] = True, False
    return tg.masked_fill(skip, -1), skip


# --- brute forces shared by the patching tests (plain hooks on the raw forward, apart from the library) ---

def grab(model, toks, names) -> dict:
    """The activations at hook points ``names`` on ``toks`` (clones, no grad)."""
    box = {}
    with torch.no_grad():
        model.run_with_hooks(toks, fwd_hooks=[(n, lambda t, hook, n=n: box.__setitem__(n, t.clone())) for n in names])
    return box


def sender_write_change(model, toks, ref, sender: str) -> torch.Tensor:
    """Reference minus run of a sender's write into the stream: ``embed`` (the stream entering block
    0), ``MLP{l}`` (its output) or ``L{l}H{h}`` (``z W_O`` of the head)."""
    if sender == "embed":
        name = "blocks.0.hook_resid_pre"
    elif sender.startswith("MLP"):
        name = f"blocks.{int(sender[3:])}.hook_mlp_out"
    else:
        l, h = (int(x) for x in sender[1:].split("H"))
        name = f"blocks.{l}.attn.hook_z"
    a, b = grab(model, ref, [name])[name], grab(model, toks, [name])[name]
    return (a - b)[:, :, h] @ model.blocks[l].attn.W_O[h] if sender.startswith("L") else a - b


def patching_metric(logits):
    """The patching tests' metric: a log-probability at the last position plus a raw logit elsewhere
    (so both the softmax and a linear read are exercised)."""
    return logits[:, -1].log_softmax(-1)[:, 3].mean() + 0.1 * logits[:, 2, 5].sum()


def random_pair(variant, seed=1, n_layers=3):
    """A variant (``make_variant``'s arguments) with 2 heads a layer and a random run/reference pair of 2 x 8 tokens."""
    model = make_variant(*variant, seed=seed, n_layers=n_layers, n_heads=2)
    g = torch.Generator().manual_seed(seed)
    toks, ref = (torch.randint(0, model.cfg.d_vocab, (2, 8), generator=g) for _ in range(2))
    return model, toks, ref
