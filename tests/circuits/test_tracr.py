"""The tracr-compiled models (issue 31): each computes its program, and its ground-truth edges are
what its weights say.

The edge recomputation here is written apart from ``scripts/compile_tracr.py``'s (which reads
tracr's Haiku parameters): it reads the loaded model's HookedTransformer-format weights through
``_backend.portable_state`` and the residual labels stored in the checkpoint.
"""

from __future__ import annotations

import ast
import pathlib
import random
import re
import sys

import pytest
import torch

from rs_interp import _backend
from rs_interp.circuits import tracr as rt
from rs_interp.circuits.graph import depth, edge_layout
from rs_interp.models.registry import SHIPPED_MODELS

N_INPUTS = 1000
#: tracr's attention is a (very cold) softmax, so numerical outputs are exact up to float32 rounding
#: (measured: 2.4e-8 on every input of frac_prevs, under both versions).
NUMERICAL_TOL = 1e-6


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny (d_model <= 43): one intra-op thread is several times faster than two
    on a busy machine, where the second thread's spin-waits dominate. Restored afterwards."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def models():
    return {name: rt.load_tracr_model(name) for name in rt.TRACR_PROGRAMS}


def random_inputs(name, n=N_INPUTS, seed=31):
    meta = rt.metadata(name)
    rng = random.Random(f"{seed}-{name}")
    return [[rng.choice(meta.vocab) for _ in range(rng.randint(1, meta.max_seq_len))] for _ in range(n)]


def same_outputs(name, got, want):
    if rt.metadata(name).output == "categorical":
        return got == want
    return len(got) == len(want) and all(abs(a - b) <= NUMERICAL_TOL for a, b in zip(got, want))


# --- the registry and the metadata ------------------------------------------------------------------

def test_every_program_is_a_toy_model(models):
    assert set(rt.TRACR_PROGRAMS) <= set(SHIPPED_MODELS)
    for name, model in models.items():
        meta, spec = rt.metadata(name), rt.PROGRAMS[name.removeprefix("tracr-")]
        assert SHIPPED_MODELS[name].trainer is None  # compiled, not trained
        assert (meta.vocab, meta.max_seq_len, meta.output) == (spec.vocab, spec.max_seq_len, spec.output)
        assert model.cfg.n_ctx == meta.max_seq_len + 1 and rt.program_of(model) == name
        assert model.cfg.normalization_type is None and model.cfg.act_fn == "relu"
        assert model.cfg.attention_dir == "bidirectional" and model.cfg.positional_embedding_type == "standard"
        assert len(meta.residual_labels) == model.cfg.d_model
        assert len(meta.token_ids) == model.cfg.d_vocab and {meta.bos, meta.pad, *meta.vocab} == set(meta.token_ids)
        d_out = len(meta.output_values) if meta.output == "categorical" else 1
        assert model.cfg.d_vocab_out == d_out
        assert {"tracr-pypi", "jax", "transformer-lens", "torch"} <= set(meta.versions)


def test_no_jax_at_run_time(models):
    """rs_interp.circuits.tracr imports nothing of tracr, JAX or Haiku (statically), and running the models
    here loaded none of them."""
    tree = ast.parse(pathlib.Path(rt.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
    banned = ("jax", "jaxlib", "haiku", "tracr", "chex")
    assert not {m for m in imported if m.split(".")[0] in banned}
    rt.run_program(models["tracr-hist"], [["a", "b"]])
    assert not [m for m in sys.modules if m.split(".")[0] in banned]


def test_names_and_bad_inputs():
    with pytest.raises(ValueError, match="must be one of"):
        rt.metadata("tracr-nope")
    with pytest.raises(ValueError, match="vocabulary"):
        rt.encode("reverse", [[1, 9]])
    with pytest.raises(ValueError, match="one length"):
        rt.encode("reverse", [[1], [1, 2]])
    with pytest.raises(ValueError, match="length must be"):
        rt.encode("reverse", [[1] * 6])
    assert rt.metadata("reverse") is rt.metadata("tracr-reverse")


# --- each model computes its program ---------------------------------------------------------------

@pytest.mark.parametrize("name", rt.TRACR_PROGRAMS)
def test_reproduces_its_program(models, name):
    inputs = random_inputs(name)
    assert len({len(x) for x in inputs}) == rt.metadata(name).max_seq_len  # every length drawn
    got = rt.run_program(models[name], inputs)
    wrong = [(x, y) for x, y in zip(inputs, got) if not same_outputs(name, y, rt.reference(name, x))]
    assert not wrong, f"{len(wrong)} of {len(inputs)} wrong, e.g. {wrong[:3]}"


def test_decode_takes_output_indices(models):
    tokens = rt.encode("hist", [["a", "b", "a", "c"]])
    logits = models["tracr-hist"](tokens)
    assert rt.decode("hist", logits.argmax(-1)) == rt.decode("hist", logits) == [[2, 1, 2, 1]]


# --- the ground-truth edges -------------------------------------------------------------------------

def rows_to_labels(matrix, labels):
    """Labels of the nonzero rows of ``matrix`` (d_model, ...)."""
    m = matrix.detach().reshape(matrix.shape[0], -1)
    return frozenset(labels[i] for i in torch.nonzero(m.ne(0).any(dim=1)).flatten().tolist())


def recompute(model, labels):
    """Writes, reads and edges from the HookedTransformer-format weights, independently of the script."""
    state = _backend.portable_state(model)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    tokens, positions = rows_to_labels(state["embed.W_E"].T, labels), rows_to_labels(state["pos_embed.W_pos"].T, labels)
    writes = {"embed": tokens | positions, "embed.tokens": tokens, "embed.pos": positions}
    reads = {"logits": rows_to_labels(state["unembed.W_U"], labels)}
    order = {"embed": 0}  # sender -> the first block it is visible to, "layer.stage": attention 0, MLP 1
    for l in range(L):
        for h in range(H):
            writes[f"L{l}H{h}"] = rows_to_labels(state[f"blocks.{l}.attn.W_O"][h].T, labels)
            order[f"L{l}H{h}"] = (l, 1)
            for x in "QKV":
                reads[f"L{l}H{h}.{x.lower()}"] = rows_to_labels(state[f"blocks.{l}.attn.W_{x}"][h], labels)
        writes[f"MLP{l}"] = rows_to_labels(state[f"blocks.{l}.mlp.W_out"].T, labels)
        reads[f"MLP{l}"] = rows_to_labels(state[f"blocks.{l}.mlp.W_in"], labels)
        order[f"MLP{l}"] = (l + 1, 0)

    def reader_at(r):  # (layer, stage) at which the receiver reads the stream
        if r == "logits":
            return (L, 0)
        if r.startswith("MLP"):
            return (int(r[3:]), 1)
        return (int(re.match(r"L(\d+)", r).group(1)), 0)

    def visible(s, r):
        return s == "embed" or order[s] <= reader_at(r)

    edges = {(s, r) for s in writes if s not in ("embed.tokens", "embed.pos") for r in reads
             if visible(s, r) and writes[s] & reads[r]}
    return writes, reads, frozenset(edges), state


@pytest.mark.parametrize("name", rt.TRACR_PROGRAMS)
def test_edges_match_the_weights(models, name):
    meta, model = rt.metadata(name), models[name]
    writes, reads, edges, state = recompute(model, meta.residual_labels)
    for k, v in state.items():
        if k.rsplit(".", 1)[-1].startswith("b"):
            assert not v.ne(0).any(), f"{k} is nonzero: the labels would not tell every write"
    assert writes == dict(meta.writes)
    assert reads == dict(meta.reads)
    assert edges == rt.ground_truth_edges(name)
    # Every write a receiver sees is a label of the residual basis: one-hot rows, nothing hidden.
    assert set().union(*writes.values(), *reads.values()) <= set(meta.residual_labels)
    # The library's own view of the weights says the same.
    w, r = rt.component_weights(model)
    assert {k: rows_to_labels(v, meta.residual_labels) for k, v in w.items()} == {k: writes[k] for k in w}
    assert {k: rows_to_labels(v, meta.residual_labels) for k, v in r.items()} == reads


@pytest.mark.parametrize("name", rt.TRACR_PROGRAMS)
def test_edges_go_forward_and_fit_the_layout(models, name):
    cfg, edges = models[name].cfg, rt.ground_truth_edges(name)
    layout = edge_layout(cfg)
    assert edges and all(s in layout.senders and r in layout.receivers for s, r in edges)
    assert edges <= set(layout.edges())
    for s, r in edges:
        assert depth(s) < depth(r), (s, r)
        if s != "embed" and r != "logits":  # the layer numbers say the same
            ls, lr = (int(re.search(r"\d+", x).group()) for x in (s, r))
            assert ls < lr or (ls == lr and s.startswith("L") and r.startswith("MLP")), (s, r)
    # The output is produced: something writes what the logits read, and the embedding feeds something.
    assert any(r == "logits" for _, r in edges) and any(s == "embed" for s, _ in edges)


# --- causal checks ----------------------------------------------------------------------------------

def zero_hooks(sender, cfg):
    """Forward hooks that remove ``sender``'s write from the residual stream everywhere."""
    if sender == "embed":
        def zero(t, *, hook):
            return torch.zeros_like(t)
        return [("hook_embed", zero), ("hook_pos_embed", zero)]
    if sender.startswith("MLP"):
        return [(f"blocks.{sender[3:]}.hook_mlp_out", lambda t, *, hook: torch.zeros_like(t))]
    l, h = map(int, re.match(r"L(\d+)H(\d+)", sender).groups())

    def zero_head(z, *, hook):  # (batch, pos, head, d_head); b_O is zero, so the head's write is z W_O
        z = z.clone()
        z[:, :, h] = 0
        return z
    return [(f"blocks.{l}.attn.hook_z", zero_head)]


def reaches_logits(edges):
    """Senders with a directed path to ``logits`` in the edge graph (receivers ``X.q`` belong to head X)."""
    alive, changed = {"logits"}, True
    while changed:
        changed = False
        for s, r in edges:
            if r.split(".")[0] in alive and s not in alive:
                alive.add(s)
                changed = True
    return alive - {"logits"}


def logits_by_length(model, name, inputs, fwd_hooks=()):
    out = {}
    with torch.no_grad(), model.hooks(fwd_hooks=list(fwd_hooks)):
        for n in sorted({len(x) for x in inputs}):
            out[n] = model(rt.encode(name, [x for x in inputs if len(x) == n]), return_type="logits")
    return out


@pytest.mark.parametrize("name", rt.TRACR_PROGRAMS)
def test_ablations_agree_with_the_edges(models, name):
    """Zeroing a sender with no path to the logits leaves them bit for bit unchanged; zeroing one
    with an edge into the logits changes the decoded outputs on some inputs."""
    model, edges = models[name], rt.ground_truth_edges(name)
    inputs = random_inputs(name, n=200, seed=7)
    clean = logits_by_length(model, name, inputs)
    alive = reaches_logits(edges)
    direct = {s for s, r in edges if r == "logits"}
    assert direct and direct <= alive
    for sender in edge_layout(model).senders:
        ablated = logits_by_length(model, name, inputs, zero_hooks(sender, model.cfg))
        if sender not in alive:
            assert all(torch.equal(ablated[n], clean[n]) for n in clean), f"{sender} has no path to the logits"
        if sender in direct:
            changed = sum(rt.decode(name, ablated[n]) != rt.decode(name, clean[n]) for n in clean)
            assert changed, f"{sender} writes what the logits read, yet removing it changes no output"


@pytest.mark.parametrize("name", rt.TRACR_PROGRAMS)
def test_direct_paths_into_the_logits(models, name):
    """A sender's write, taken out of the logits' input alone, moves the logits iff it has an edge into them."""
    model, edges = models[name], rt.ground_truth_edges(name)
    inputs = random_inputs(name, n=200, seed=8)
    n = max(len(x) for x in inputs)
    tokens = rt.encode(name, [x for x in inputs if len(x) == n])
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    W_U = model.W_U.detach()
    writes = {"embed": cache["hook_embed"] + cache["hook_pos_embed"]}
    for l in range(model.cfg.n_layers):
        z = cache[f"blocks.{l}.attn.hook_z"]
        for h in range(model.cfg.n_heads):
            writes[f"L{l}H{h}"] = z[:, :, h] @ model.W_O[l, h].detach()
        writes[f"MLP{l}"] = cache[f"blocks.{l}.hook_mlp_out"]
    for sender, w in writes.items():
        moved = (w @ W_U).abs().amax().item()
        if (sender, "logits") in edges:
            assert moved > 0.1, sender
        else:
            assert moved == 0, sender
