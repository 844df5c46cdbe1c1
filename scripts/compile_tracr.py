#!/usr/bin/env python
"""Compile RASP programs with tracr and export each as an rs_interp checkpoint (issue 31).

Not run by CI: tracr needs JAX and Haiku, which stay out of rs_interp's runtime. Set-up, once:

    python3 -m venv .venv-tracr
    .venv-tracr/bin/pip install torch==2.13.0 tracr-pypi "transformer-lens>=3.9,<4" transformers einops \
        jaxtyping safetensors tqdm plotly
    .venv-tracr/bin/pip install -e . --no-deps        # or: pip install -e ".[tracr]"

Then ``nice -n 19 .venv-tracr/bin/python scripts/compile_tracr.py`` writes
``rs_interp/toy_models/tracr-<program>.json`` + ``.safetensors`` for every program of
:data:`rs_interp.circuits.tracr.PROGRAMS` (``--only reverse sort`` for some, ``--out DIR`` elsewhere).

For each program it: builds the RASP program from tracr's library; compiles it
(``compiler_bos="BOS"``, ``compiler_pad="PAD"``); converts the weights to HookedTransformer's
names as TransformerLens's "Tracr_to_Transformer_Lens" demo does (heads split from Haiku's
concatenated projections, which tracr has already padded with zeros to the widest head and the
most heads of any layer; ``W_U`` the projection of the residual stream onto the output space, no
bias; no LayerNorm, ReLU, learned positions, bidirectional attention: all of which TransformerLens
4.3's native bridges build too); checks on *every* input up to the maximum length that the converted model, tracr's own
forward pass and the plain-Python reference agree; derives the residual labels each component
writes and reads, and from them the ground-truth edges (see :mod:`rs_interp.circuits.tracr`); and saves
with :func:`rs_interp.models.checkpoints.save_model`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax.numpy as jnp  # noqa: E402
from tracr.compiler import compiling, lib  # noqa: E402
from tracr.rasp import rasp  # noqa: E402

from rs_interp import _backend  # noqa: E402
from rs_interp.circuits.graph import EdgeLayout, edge_layout  # noqa: E402  (plain Python, no JAX)
from rs_interp.circuits.tracr import PROGRAMS  # noqa: E402
from rs_interp.models.checkpoints import build_model, save_model  # noqa: E402

BOS, PAD = "BOS", "PAD"
#: Numerical outputs must match the reference to this (tracr's attention is a softmax, not a hard
#: max; measured: 2.4e-8 in float32).
NUMERICAL_TOL = 1e-6


def rasp_program(name: str, max_seq_len: int) -> rasp.SOp:
    """The RASP program ``name`` (see ``rs_interp.circuits.tracr.PROGRAMS`` for what each computes)."""
    if name == "reverse":
        return lib.make_reverse(rasp.tokens)
    if name == "sort":
        return lib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=max_seq_len, min_key=1)
    if name == "hist":
        return lib.make_hist()
    if name == "frac_prevs":
        return lib.make_frac_prevs(rasp.tokens == "x")
    if name == "at_least_half":
        # tracr infers a numerical mean's values as {v / n} for v in {0, 1} (its TODO b/255936408),
        # missing 2/3, 3/4, 2/5 ...; its discretising MLP (cuts at the midpoints) then maps each
        # true value to the nearest inferred one. The cut at 1/2 falls right for every fraction k/n,
        # n <= 5 (a cut at "> 1/2" would not: 2/3 goes to 1/2); `check` confirms it on every input.
        frac = lib.make_frac_prevs(rasp.tokens == "x")
        return rasp.numerical(rasp.Map(lambda f: 1.0 if f >= 0.5 else 0.0, frac)).named("at_least_half")
    raise ValueError(f"unknown program {name!r}")


def heads_first(w: np.ndarray, n_heads: int, d_head: int, layout: str) -> torch.Tensor:
    """Haiku's concatenated head projections split per head, as the TransformerLens demo does."""
    if layout == "in":  # (d_model, heads * d_head) -> (heads, d_model, d_head)
        return torch.tensor(w.reshape(w.shape[0], n_heads, d_head).transpose(1, 0, 2))
    if layout == "out":  # (heads * d_head, d_model) -> (heads, d_head, d_model)
        return torch.tensor(w.reshape(n_heads, d_head, w.shape[1]))
    if layout == "bias":  # (heads * d_head,) -> (heads, d_head)
        return torch.tensor(w.reshape(n_heads, d_head))
    raise ValueError(layout)


def convert(compiled, program: rasp.SOp, name: str, max_seq_len: int):
    """The compiled model as an rs_interp model (TransformerLens 3.x here), and its output labels."""
    mc, params = compiled.model_config, {k: {p: np.asarray(v, dtype=np.float32) for p, v in d.items()}
                                         for k, d in compiled.params.items()}
    labels = list(compiled.residual_labels)
    d_model = len(labels)
    W_E, W_pos = params["token_embed"]["embeddings"], params["pos_embed"]["embeddings"]
    assert W_E.shape[1] == d_model and W_pos.shape == (max_seq_len + 1, d_model)
    categorical = PROGRAMS[name].output == "categorical"
    if categorical:
        enc = compiled.output_encoder.encoding_map
        output_values = sorted(enc, key=enc.get)
        out_labels = [f"{program.label}:{v}" for v in output_values]
    else:
        output_values, out_labels = None, [program.label]
    W_U = np.zeros((d_model, len(out_labels)), dtype=np.float32)
    for j, lab in enumerate(out_labels):
        W_U[labels.index(lab), j] = 1.0

    H, dh = mc.num_heads, mc.key_size
    cfg = _backend.make_config(
        n_layers=mc.num_layers, d_model=d_model, n_heads=H, d_head=dh, d_mlp=mc.mlp_hidden_size,
        d_vocab=W_E.shape[0], d_vocab_out=len(out_labels), n_ctx=max_seq_len + 1, act_fn="relu",
        normalization_type=None, attention_dir="bidirectional", positional_embedding_type="standard",
        attn_only=False, model_name=f"tracr-{name}", original_architecture="tracr", seed=None, device="cpu",
    )
    state = {"embed.W_E": torch.tensor(W_E), "pos_embed.W_pos": torch.tensor(W_pos), "unembed.W_U": torch.tensor(W_U),
             "unembed.b_U": torch.zeros(len(out_labels))}
    for l in range(mc.num_layers):
        p = f"transformer/layer_{l}"
        for x, hk_name in (("Q", "query"), ("K", "key"), ("V", "value")):
            state[f"blocks.{l}.attn.W_{x}"] = heads_first(params[f"{p}/attn/{hk_name}"]["w"], H, dh, "in")
            state[f"blocks.{l}.attn.b_{x}"] = heads_first(params[f"{p}/attn/{hk_name}"]["b"], H, dh, "bias")
        state[f"blocks.{l}.attn.W_O"] = heads_first(params[f"{p}/attn/linear"]["w"], H, dh, "out")
        state[f"blocks.{l}.attn.b_O"] = torch.tensor(params[f"{p}/attn/linear"]["b"])
        state[f"blocks.{l}.mlp.W_in"] = torch.tensor(params[f"{p}/mlp/linear_1"]["w"])
        state[f"blocks.{l}.mlp.b_in"] = torch.tensor(params[f"{p}/mlp/linear_1"]["b"])
        state[f"blocks.{l}.mlp.W_out"] = torch.tensor(params[f"{p}/mlp/linear_2"]["w"])
        state[f"blocks.{l}.mlp.b_out"] = torch.tensor(params[f"{p}/mlp/linear_2"]["b"])
    for k, v in state.items():
        if k.rsplit(".", 1)[-1].startswith("b_") and bool(v.ne(0).any()):
            raise AssertionError(f"{k} is nonzero: the edge derivation assumes tracr's zero biases")
    model = build_model(cfg)
    _backend.load_portable_state(model, state)
    model.eval()
    params["unembed"] = {"W_U": W_U}
    return model, params, output_values


def labels_of(matrix: np.ndarray, labels: list[str]) -> list[str]:
    """The labels of the nonzero rows of ``matrix`` (rows = residual directions)."""
    rows = np.flatnonzero(np.abs(matrix.reshape(matrix.shape[0], -1)).sum(axis=1) > 0)
    return [labels[i] for i in rows]


def reads_and_writes(compiled, params) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Residual labels each sender writes and each receiver reads, from tracr's own parameters
    (Haiku layout: inputs map ``residual -> heads * d_head``, outputs ``heads * d_head -> residual``)."""
    mc, labels = compiled.model_config, list(compiled.residual_labels)
    H, dh = mc.num_heads, mc.key_size
    tok, pos = params["token_embed"]["embeddings"], params["pos_embed"]["embeddings"]
    writes = {"embed.tokens": labels_of(tok.T, labels), "embed.pos": labels_of(pos.T, labels)}
    writes["embed"] = sorted(set(writes["embed.tokens"]) | set(writes["embed.pos"]), key=labels.index)
    reads: dict[str, list[str]] = {}
    for l in range(mc.num_layers):
        p = f"transformer/layer_{l}"
        for h in range(H):
            cols = slice(h * dh, (h + 1) * dh)
            writes[f"L{l}H{h}"] = labels_of(params[f"{p}/attn/linear"]["w"][cols, :].T, labels)
            for x, hk_name in (("q", "query"), ("k", "key"), ("v", "value")):
                reads[f"L{l}H{h}.{x}"] = labels_of(params[f"{p}/attn/{hk_name}"]["w"][:, cols], labels)
        writes[f"MLP{l}"] = labels_of(params[f"{p}/mlp/linear_2"]["w"].T, labels)
        reads[f"MLP{l}"] = labels_of(params[f"{p}/mlp/linear_1"]["w"], labels)
    reads["logits"] = labels_of(params["unembed"]["W_U"], labels)  # the projection onto the output space
    return writes, reads


def edges_from(writes: dict[str, list[str]], reads: dict[str, list[str]], layout: EdgeLayout) -> list[list[str]]:
    """``[sender, receiver]`` for every edge of the layout whose receiver reads a label its sender writes."""
    return [[s, r] for s, r in layout.edges() if set(writes[s]) & set(reads[r])]


def check(model, compiled, name: str, output_values, max_seq_len: int) -> int:
    """Every input of every length: converted model == tracr's forward == the reference. Returns the count."""
    spec, enc = PROGRAMS[name], compiled.input_encoder.encoding_map
    total = 0
    for n in range(1, max_seq_len + 1):
        inputs = [list(x) for x in itertools.product(spec.vocab, repeat=n)]
        tokens = np.array([[enc[BOS]] + [enc[t] for t in x] for x in inputs])
        theirs = np.asarray(compiled.forward(compiled.params, jnp.array(tokens)).unembedded_output)[:, 1:]
        with torch.no_grad():
            logits = model(torch.tensor(tokens), return_type="logits")
        for i, x in enumerate(inputs):
            want = spec.reference(x)
            if spec.output == "categorical":
                mine = [output_values[j] for j in logits[i, 1:].argmax(-1).tolist()]
                tracr_out = [output_values[int(j)] for j in theirs[i]]
                ok = mine == want == tracr_out
            else:
                mine = logits[i, 1:, 0].tolist()
                ok = all(math.isclose(a, w, abs_tol=NUMERICAL_TOL) and math.isclose(b, w, abs_tol=NUMERICAL_TOL)
                         for a, b, w in zip(mine, theirs[i].tolist(), want))
            if not ok:
                raise AssertionError(f"{name}{x}: converted {mine}, tracr {theirs[i].tolist()}, reference {want}")
        total += len(inputs)
    return total


def versions() -> dict[str, str]:
    return {pkg: importlib.metadata.version(pkg) for pkg in ("tracr-pypi", "jax", "dm-haiku", "transformer-lens", "torch")}


def compile_one(name: str, out: Path) -> dict:
    spec = PROGRAMS[name]
    # RASP labels are "name_id" with ids from one global counter, drawn as the compiler first reads
    # each label: restart it so a program's residual labels do not depend on what was compiled before.
    rasp.RASPExpr._ids = itertools.count(1)
    program = rasp_program(name, spec.max_seq_len)
    start = time.perf_counter()
    compiled = compiling.compile_rasp_to_model(program, vocab=set(spec.vocab), max_seq_len=spec.max_seq_len,
                                               compiler_bos=BOS, compiler_pad=PAD)
    seconds = time.perf_counter() - start
    model, params, output_values = convert(compiled, program, name, spec.max_seq_len)
    checked = check(model, compiled, name, output_values, spec.max_seq_len)
    writes, reads = reads_and_writes(compiled, params)
    cfg = model.cfg
    edges = edges_from(writes, reads, edge_layout(cfg))
    enc = compiled.input_encoder.encoding_map
    meta = {
        "program": name,
        "description": spec.description,
        "vocab": list(spec.vocab),
        "max_seq_len": spec.max_seq_len,
        "bos": BOS,
        "pad": PAD,
        "token_ids": sorted(enc, key=enc.get),
        "output": spec.output,
        "output_values": output_values,
        "residual_labels": list(compiled.residual_labels),
        "embedding": "one sender 'embed' (token + position embedding); writes['embed.tokens'] and "
                     "writes['embed.pos'] give the two parts",
        "writes": writes,
        "reads": reads,
        "edges": edges,
        "versions": versions(),
        "compile_seconds": round(seconds, 1),
        "inputs_checked": checked,
    }
    save_model(model, out / f"tracr-{name}", metadata={"tracr": meta})
    return {"name": name, "layers": cfg.n_layers, "heads": cfg.n_heads, "d_head": cfg.d_head, "d_model": cfg.d_model,
            "d_mlp": cfg.d_mlp, "edges": len(edges), "compile_s": round(seconds, 1), "checked": checked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "rs_interp" / "toy_models")
    parser.add_argument("--only", nargs="+", choices=sorted(PROGRAMS), default=list(PROGRAMS))
    args = parser.parse_args(argv)
    for name in args.only:
        row = compile_one(name, args.out)
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
