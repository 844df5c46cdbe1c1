"""Other libraries' transcoder files (issue 54 item 5, issue 60): files written here as each format's owner writes
them (pchlenski's transcoder_circuits, EleutherAI sparsify on main and on its clt branch, circuit-tracer), read, and
compared with the owner's own encode and decode (each written line by line from the owner's code, cited where it
stands) at 1e-12 in float64; converted to circuit-tracer's files and read back where circuit-tracer holds the
activation; a graph made with the read set is exact (its doubling test, here the row sums). Every field and tensor
an owner's saver writes that the reader does not compute is refused by name."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from safetensors.torch import load_file, save_file

from rs_interp.features import CrossLayerTranscoder, attribution_graph, intervene, load_transcoders, qk_attributions
from rs_interp.features.formats import convert_to_circuit_tracer, load_pchlenski_transcoders, load_sparsify_transcoders
from tests.features.test_graph import Frozen, _rows, assert_columns
from tests.features.test_transcoders import _mlp_input, relu_model

D, W, L = 16, 24, 2


def _pchlenski_files(tmp_path, *, as_object: bool, hook=None):
    """One .pt a layer as transcoder_circuits saves them; the config a pickled sae_training object (its
    module present only while saving) or a dict."""
    g = torch.Generator().manual_seed(0)
    files, raw = [], []
    if as_object:
        mod = types.ModuleType("sae_training.config")
        cls = type("LanguageModelSAERunnerConfig", (), {"__module__": "sae_training.config"})
        mod.LanguageModelSAERunnerConfig = cls
        sys.modules["sae_training"], sys.modules["sae_training.config"] = types.ModuleType("sae_training"), mod
    try:
        for l in range(L):
            sd = {"W_enc": torch.randn(D, W, generator=g) * 0.3, "b_enc": torch.randn(W, generator=g) * 0.1 - 0.1,
                  "W_dec": torch.randn(W, D, generator=g) * 0.3, "b_dec": torch.randn(D, generator=g) * 0.2,
                  "b_dec_out": torch.randn(D, generator=g) * 0.2}
            fields = {"hook_point": hook or f"blocks.{l}.ln2.hook_normalized", "hook_point_layer": l, "d_in": D, "d_out": D,
                      "out_hook_point": f"blocks.{l}.hook_mlp_out", "is_transcoder": True}
            if as_object:
                cfg = cls()
                cfg.__dict__.update(fields)
            else:
                cfg = fields
            path = tmp_path / f"final_sparse_autoencoder_gpt2-small_blocks.{l}.ln2.hook_normalized_{W}.pt"
            torch.save({"cfg": cfg, "state_dict": sd}, path)
            files.append(path)
            raw.append(sd)
    finally:
        if as_object:
            del sys.modules["sae_training"], sys.modules["sae_training.config"]
    return files, raw


def pchlenski_forward(sd, x):
    """(feature_acts, sae_out) of transcoder_circuits' ``SparseAutoencoder.forward`` for a transcoder (jacobdunefsky/
    transcoder_circuits at 8721ff06b64889e8cc50bb1c5e869c7f72b8303d, sae_training/sparse_autoencoder.py, lines 105-131;
    its repository states no licence, so these lines are written again, not copied: the same operations in order)."""
    sae_in = x - sd["b_dec"]
    hidden_pre = torch.einsum("...i,is->...s", sae_in, sd["W_enc"]) + sd["b_enc"]
    feature_acts = torch.nn.functional.relu(hidden_pre)
    return feature_acts, torch.einsum("...s,so->...o", feature_acts, sd["W_dec"]) + sd["b_dec_out"]


@pytest.mark.parametrize("as_object", [True, False], ids=["pickled-config", "dict-config"])
def test_pchlenskis_transcoders(tmp_path, as_object):
    files, raw = _pchlenski_files(tmp_path, as_object=as_object)
    tcs = load_pchlenski_transcoders(files, dtype=torch.float64)
    assert tcs.input_point == "ln2.hook_normalized" and len(tcs) == L
    x = torch.randn(7, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for tc, sd in zip(tcs, raw):
        acts, out = pchlenski_forward({k: v.double() for k, v in sd.items()}, x)
        assert torch.allclose(tc.encode(x), acts, atol=1e-12, rtol=0)
        assert torch.allclose(tc(x), out, atol=1e-12, rtol=0)
    back = load_transcoders(convert_to_circuit_tracer(tcs, tmp_path / "ct"), dtype=torch.float64)
    assert back.input_point == "ln2.hook_normalized" and torch.equal(back[1].W_enc, tcs[1].W_enc)
    model = relu_model("LN", seed=3, n_layers=L, d_model=D)
    g = attribution_graph(model, back, torch.arange(8), max_logits=3)
    rows = g.target_nodes()
    assert torch.allclose(g.rows().sum(1) + g.bias[rows], g.values[rows], atol=1e-9, rtol=0)
    (tmp_path / "other").mkdir()
    bad, _ = _pchlenski_files(tmp_path / "other", as_object=False, hook="blocks.0.hook_resid_pre")
    with pytest.raises(ValueError, match="ln2.hook_normalized"):
        load_pchlenski_transcoders(bad)


def test_pchlenski_keys_it_does_not_read_are_refused_by_name(tmp_path):
    files, _ = _pchlenski_files(tmp_path, as_object=False)
    data = torch.load(files[1], weights_only=False)
    torch.save({"cfg": data["cfg"], "state_dict": data["state_dict"] | {"W_gate": torch.zeros(2)}}, files[1])
    with pytest.raises(ValueError, match="holds 'W_gate', which rs_interp does not read"):
        load_pchlenski_transcoders(files)
    torch.save({"cfg": data["cfg"] | {"is_transcoder": False}, "state_dict": data["state_dict"]}, files[1])
    with pytest.raises(ValueError, match="is_transcoder is false"):
        load_pchlenski_transcoders(files)


# --- circuit-tracer's files, as its own code writes and computes ----------------------------------------------------
#
# decoderesearch/circuit-tracer (MIT licence) at 4bb8c0ea10bde09727e14565ec8469656880da53: the lines below follow
# circuit_tracer/transcoder/single_layer_transcoder.py (``SingleLayerTranscoder.to_safetensors``, ``encode``,
# ``decode``, ``compute_skip``; ``load_transcoder_set`` keeps ``k`` in the config) and
# circuit_tracer/transcoder/activation_functions.py (``TopK.forward``, ``jumprelu.forward``).

def circuit_tracer_write(path, W_enc, W_dec, b_enc, b_dec, *, threshold=None, W_skip=None):
    """``SingleLayerTranscoder.to_safetensors``: the state dict it saves (a TopK's ``k`` in config.yaml)."""
    state_dict = {"W_enc": W_enc, "W_dec": W_dec, "b_enc": b_enc, "b_dec": b_dec}
    if threshold is not None:
        state_dict["activation_function.threshold"] = threshold
    if W_skip is not None:
        state_dict["W_skip"] = W_skip
    save_file(state_dict, str(path))


def circuit_tracer_forward(sd, x, activation, k=None):
    """(acts, reconstruction): ``encode`` (``F.linear`` then the activation) and ``decode`` (``acts @ W_dec + b_dec``,
    plus ``input_acts @ W_skip.T``)."""
    pre = torch.nn.functional.linear(x, sd["W_enc"], sd["b_enc"])
    if activation == "topk":
        _, indices = torch.topk(pre, k=k, dim=-1)
        gate = torch.zeros_like(pre)
        gate.scatter_(dim=-1, index=indices, value=1)
        acts = pre * gate
    elif activation == "jumprelu":
        acts = pre * (pre > sd["activation_function.threshold"])
    else:
        acts = torch.nn.functional.relu(pre)
    out = acts @ sd["W_dec"] + sd["b_dec"]
    return acts, out if "W_skip" not in sd else out + x @ sd["W_skip"].T


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_circuit_tracers_files_are_read_as_it_computes_them(tmp_path, activation):
    g = torch.Generator().manual_seed(4)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3  # noqa: E731
    folder = tmp_path / "ct"
    folder.mkdir()
    raw = []
    for layer in range(L):
        sd = {"W_enc": r(W, D), "W_dec": r(W, D), "b_enc": r(W) - 0.3, "b_dec": r(D)}
        sd |= {"activation_function.threshold": r(W).abs()} if activation == "jumprelu" else {}
        sd |= {"W_skip": r(D, D)} if activation != "relu" else {}
        circuit_tracer_write(folder / f"layer_{layer}.safetensors", **{k.split(".")[-1]: v for k, v in sd.items()})
        raw.append(sd)
    (folder / "config.yaml").write_text("model_kind: transcoder_set\nscan: test\nfeature_input_hook: mlp.hook_in\n"
                                        f"feature_output_hook: mlp.hook_out\nactivation: {activation}\n"
                                        + ("k: 4\n" if activation == "topk" else ""))
    tcs = load_transcoders(folder, dtype=torch.float64)
    x = torch.randn(7, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for tc, sd in zip(tcs, raw):
        acts, out = circuit_tracer_forward(sd, x, activation, k=4)
        assert torch.allclose(tc.encode(x), acts, atol=1e-12, rtol=0)
        assert torch.allclose(tc(x), out, atol=1e-12, rtol=0)


# --- EleutherAI sparsify, as its own code writes and computes ---------------------------------------------------
#
# The lines below follow EleutherAI/sparsify (MIT licence) line by line, as the minimal part needed here (sparsify
# is no dependency of rs_interp's; its package imports a trainer, datasets and GPU kernels):
# - main at 9d3b136c9217565af11089081444770e0d31673d, sparsify/sparse_coder.py (``SparseCoder.__init__``'s
#   parameters, ``save_to_disk``, ``encode``, ``decode``, ``forward``'s skip), sparsify/fused_encoder.py
#   (``FusedEncoder.forward``: ``relu(linear)`` then ``topk``), sparsify/config.py (``SparseCoderConfig``);
# - the clt branch at d7f7368ec229cebd8975ff21561459655c0b375a, sparsify/sparse_coder.py (``SparseCoder.__init__``'s
#   ``W_decs``, ``b_decs``, ``W_skips``, ``in_norm``/``out_norm``, ``post_encs``, ``post_enc_scales``;
#   ``normalize_input``, ``denormalize_output``, ``decode(index)``, ``MidDecoder.current_latent_acts`` and
#   ``__call__``), sparsify/runner.py (``CrossLayerRunner.decode`` without coalescing), sparsify/config.py.
# Checked against that code itself (run from the two commits' sources on CPU): the reader's activations and outputs
# equal sparsify's to 3e-16 (main) and 2.4e-15 (clt, outputs of size 10).

_MAIN_CONFIG = dict(activation="topk", expansion_factor=32, normalize_decoder=True, num_latents=0, k=32,
                    multi_topk=False, skip_connection=False, transcode=False)
_CLT_CONFIG = _MAIN_CONFIG | dict(n_targets=0, n_sources=0, normalize_io=False, divide_cross_layer=False,
                                  train_post_encoder=True, post_encoder_scale=False, coalesce_topk="none",
                                  topk_coalesced=True)


class SparsifyCoder(torch.nn.Module):
    """sparsify's ``SparseCoder`` (either commit): its parameters under its names, its encoder and decoders."""

    def __init__(self, d_in, cfg):
        super().__init__()
        self.cfg, self.d_in = cfg, d_in
        self.num_latents = cfg["num_latents"] or d_in * cfg["expansion_factor"]
        self.multi_target = cfg.get("n_targets", 0) > 0 and cfg["transcode"]
        z = lambda *shape: torch.nn.Parameter(torch.zeros(*shape, dtype=torch.float64))  # noqa: E731
        self.encoder = torch.nn.Linear(d_in, self.num_latents, dtype=torch.float64)
        n = cfg.get("n_targets", 0)
        if self.multi_target:
            self.W_decs = torch.nn.ParameterList([z(self.num_latents, d_in) for _ in range(n)])
            self.b_decs = torch.nn.ParameterList([z(d_in) for _ in range(n)])
            if cfg["skip_connection"]:
                self.W_skips = torch.nn.ParameterList([z(d_in, d_in) for _ in range(n)])
        else:
            self.W_dec, self.b_dec = z(self.num_latents, d_in), z(d_in)
            self.W_skip = z(d_in, d_in) if cfg["skip_connection"] else None
        if cfg.get("normalize_io"):
            self.register_buffer("in_norm", torch.ones(1, dtype=torch.float64))
            self.register_buffer("out_norm", torch.ones(1, dtype=torch.float64))
        if "n_targets" in cfg:  # the clt branch
            if self.multi_target:
                self.post_encs = torch.nn.ParameterList([z(self.num_latents) for _ in range(n)])
            else:
                self.post_enc = z(self.num_latents)
            if cfg["post_encoder_scale"]:
                ones = lambda: torch.nn.Parameter(torch.ones(self.num_latents, dtype=torch.float64))  # noqa: E731
                if self.multi_target:
                    self.post_enc_scales = torch.nn.ParameterList([ones() for _ in range(n)])
                else:
                    self.post_enc_scale = ones()

    def save_to_disk(self, path):
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(path / "sae.safetensors"))
        (path / "cfg.json").write_text(json.dumps({**self.cfg, "d_in": self.d_in}))

    def normalize_input(self, x):
        return x * (x.shape[-1] ** 0.5 / self.in_norm) if self.cfg.get("normalize_io") else x

    def denormalize_output(self, x):
        return x * (self.out_norm / (x.shape[-1] ** 0.5)) if self.cfg.get("normalize_io") else x

    def encode(self, x):
        """(top_acts, top_indices): FusedEncoder.forward, ``relu`` of the linear map, then ``topk``."""
        pre = torch.nn.functional.relu(torch.nn.functional.linear(self.normalize_input(x), self.encoder.weight,
                                                                  self.encoder.bias))
        return torch.topk(pre, self.cfg["k"], dim=-1, sorted=False)

    def decode(self, acts, indices, index=0):
        W = self.W_decs[index] if self.multi_target else self.W_dec
        b = self.b_decs[index] if self.multi_target else self.b_dec
        return torch.nn.functional.embedding_bag(indices, W, per_sample_weights=acts, mode="sum") + b

    def write(self, x, acts, indices, index, *, keep=None, skips_only=False):
        """MidDecoder.__call__'s ``sae_out`` before denormalising: the latents with their post-encoder terms
        (current_latent_acts), decoded for target ``index``, plus that target's skip of the normalised input.
        Test-side options: ``keep`` (a mask like ``acts``) drops the selected latents it is False at (their writes,
        post-encoder terms included, are then the difference); ``skips_only``: the skip term alone."""
        if "n_targets" in self.cfg:
            pe = self.post_encs[index] if self.multi_target else self.post_enc
            acts = acts + pe[indices]
            if self.cfg["post_encoder_scale"]:
                acts = acts * (self.post_enc_scales[index] if self.multi_target else self.post_enc_scale)[indices]
        out = self.decode(acts if keep is None else acts * keep, indices, index)
        skip = self.W_skips[index] if hasattr(self, "W_skips") else getattr(self, "W_skip", None)
        out = torch.zeros_like(out) if skips_only else out
        return out if skip is None else out + self.normalize_input(x) @ skip.mT


def sparsify_outputs(coders, xs, *, drop=None, skips_only=False):
    """Every layer's output as CrossLayerRunner.decode sums it (no coalescing): at layer ``m``, the earlier coders
    still writing (their ``index``-th target), divided by their number where ``m``'s ``divide_cross_layer``, plus its
    own write, denormalised by ``m``. Test-side: ``drop=(l, p, f)`` without latent ``f`` of layer ``l`` at row ``p``
    (if selected there); ``skips_only``: the skips' terms alone (SparsifyCoder.write)."""
    alive, outs = {}, []

    def write(l, c, x, acts, idx, index):
        keep = None
        if drop is not None and drop[0] == l:
            keep = torch.ones_like(acts)
            keep[drop[1]] = (idx[drop[1]] != drop[2]).to(acts.dtype)
        return c.write(x, acts, idx, index, keep=keep, skips_only=skips_only)

    for m, coder in enumerate(coders):
        alive[m] = (coder, xs[m], *coder.encode(xs[m]), 0)
        earlier = 0
        for l in [l for l in alive if l != m]:
            earlier = earlier + write(l, *alive[l])
        divide = max(1, len(alive) - 1) if coder.cfg.get("divide_cross_layer") else 1
        outs.append(coder.denormalize_output(write(m, *alive[m]) + earlier / divide))
        for l in list(alive):
            c, x, acts, idx, index = alive[l]
            if index + 1 >= max(c.cfg.get("n_targets", 0), 1):
                del alive[l]
            else:
                alive[l] = (c, x, acts, idx, index + 1)
    return outs


def _coders(folder, branch, *, L=3, k=4, skip=True, **cfg):
    """Random coders of ``branch`` saved by its ``save_to_disk``: every tensor drawn, the encoder bias negative
    (fewer than k pre-activations positive), every skip and post-encoder term zero but where ``cfg`` asks."""
    g = torch.Generator().manual_seed(2)
    coders = []
    for l in range(L):
        base = dict(_MAIN_CONFIG if branch == "main" else _CLT_CONFIG, transcode=True, k=k, expansion_factor=W // D,
                    skip_connection=skip)
        extra = {key: (min(v, L - l) if key == "n_targets" else v) for key, v in cfg.items() if not key.startswith("_")}
        coder = SparsifyCoder(D, base | extra)
        with torch.no_grad():
            for name, p in list(coder.named_parameters()) + list(coder.named_buffers()):
                if name.startswith(("post_encs", "post_enc")) and "scale" not in name:
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * cfg.get("_post_enc", 0.0))
                elif "norm" in name or "scale" in name:
                    p.copy_(0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64))
                elif name.startswith("W_skips.") and not name.endswith(".0"):
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * cfg.get("_cross_skip", 0.0))
                else:
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
            coder.encoder.bias.sub_(cfg.get("_bias", 0.8))
        coder.save_to_disk(folder / f"layers.{l}.mlp")
        coders.append(coder)
    return coders


def _dense(coder, x):
    acts, idx = coder.encode(x)
    return torch.zeros(*x.shape[:-1], coder.num_latents, dtype=torch.float64).scatter(-1, idx, acts)


def _inputs(L, n=9):
    return [torch.randn(n, D, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + l)) for l in range(L)]


@pytest.mark.parametrize("skip", [False, True])
def test_sparsifys_topk_is_the_k_largest_of_relu(tmp_path, skip):
    """sparsify (main): ``topk(relu(x W^T + b))``; with a negative encoder bias fewer than k pre-activations are
    positive in some rows, where circuit-tracer's TopK (the reader before issue 60) kept negative ones: activations
    and outputs the owner's to 1e-12."""
    coders = _coders(tmp_path / "sp", "main", skip=skip)
    tcs = load_sparsify_transcoders(tmp_path / "sp", dtype=torch.float64)
    assert {tc.activation for tc in tcs} == {"relu_topk"} and len(tcs) == 3
    xs = _inputs(3)
    short = 0
    for l, (tc, coder) in enumerate(zip(tcs, coders)):
        pre = xs[l] @ coder.encoder.weight.T + coder.encoder.bias
        short += int(((pre > 0).sum(-1) < coder.cfg["k"]).sum())
        assert torch.allclose(tc.encode(xs[l]), _dense(coder, xs[l]), atol=1e-12, rtol=0)
        assert torch.allclose(tc(xs[l]), sparsify_outputs([coder], [xs[l]])[0], atol=1e-12, rtol=0)
    assert short > 0, "some rows have fewer than k positive pre-activations (the case the ReLU decides)"
    with pytest.raises(ValueError, match="relu_topk.*no circuit-tracer file"):
        convert_to_circuit_tracer(tcs, tmp_path / "ct")


@pytest.mark.parametrize("setting", ["plain", "normalised io, divided, scaled"])
def test_sparsifys_cross_layer_coders_are_read_as_its_runner_sums_them(tmp_path, setting):
    """sparsify's clt branch: two targets a layer (three layers), each target's own skip ``W_skips.0`` and bias, the
    saver's ``post_encs`` (zeros, as untrained), and (second case) input/output norms, divided cross-layer writes and
    post-encoder scales, all folded: the read coder's activations and every layer's output equal the owner's."""
    norms = dict(normalize_io=True, divide_cross_layer=True, post_encoder_scale=True) if setting != "plain" else {}
    coders = _coders(tmp_path / "clt", "clt", n_targets=2, **norms)
    clt = load_sparsify_transcoders(tmp_path / "clt", dtype=torch.float64)
    assert isinstance(clt, CrossLayerTranscoder) and clt[0].W_skip is not None
    xs = _inputs(3)
    for l, coder in enumerate(coders):
        assert torch.allclose(clt[l].encode(xs[l]), _dense(coder, xs[l]), atol=1e-12, rtol=0)
    for m, (got, want) in enumerate(zip(clt.reconstruct(xs), sparsify_outputs(coders, xs))):
        assert torch.allclose(got, want, atol=1e-12, rtol=0), m
    model = relu_model("LN", seed=3, n_layers=3, d_model=D)
    g = attribution_graph(model, clt, torch.arange(8), max_logits=3)
    rows = g.target_nodes()
    assert torch.allclose(g.rows().sum(1) + g.bias[rows], g.values[rows], atol=1e-9, rtol=0)


class SparsifyFrozen(Frozen):
    """tests/features/test_graph.py's brute-force frozen replacement model with sparsify's coders themselves: the
    skips' writes (sparsify's own sum of them, cross-layer ones included) follow the run's inputs, a feature's
    pre-activation is its coder's encoder on the normalised input; nothing of rs_interp's transcoders is used."""

    def __init__(self, model, coders, tokens):
        self.coders = coders
        super().__init__(model, None, tokens)

    def skip(self, l, xs):
        return sparsify_outputs(self.coders[: l + 1], [xs[i] for i in range(l + 1)], skips_only=True)[l]

    def pre(self, l, x, f):
        c = self.coders[l]
        return (c.normalize_input(x) @ c.encoder.weight[f] + c.encoder.bias[f]).detach()


@pytest.mark.parametrize("n_targets", [0, 2], ids=["per-layer", "cross-layer"])
def test_sparsifys_post_encoder_biases_and_skips_into_later_layers(tmp_path, n_targets):
    """sparsify's clt branch with every term nonzero: post-encoder biases (``post_enc``, ``post_encs.{j}``, added
    to each *selected* latent, zeros among a ReLU-TopK's picks included), skips into later layers
    (``W_skips.{j > 0}``), norms, divided writes and post-encoder scales. The read set's activations and outputs are
    the owner's (1e-12); the graph made with it is exact by a brute force built from sparsify's coders alone: its
    values, errors, and the columns of features (a selected one at activation 0 among them: it writes ``c W_dec``),
    error and token nodes (through the skips into later layers); the rows plus bias sum to the values; the library's
    frozen intervention moves the targets as the columns say."""
    coders = _coders(tmp_path / "sp", "clt", n_targets=n_targets, normalize_io=True, divide_cross_layer=True,
                     post_encoder_scale=True, _post_enc=0.5, _cross_skip=0.3, _bias=4.0)
    tcs = load_sparsify_transcoders(tmp_path / "sp", dtype=torch.float64)
    assert isinstance(tcs, CrossLayerTranscoder) == (n_targets > 0) and tcs[1].post_bias is not None
    xs = _inputs(3)
    for l, coder in enumerate(coders):
        assert torch.allclose(tcs[l].encode(xs[l]), _dense(coder, xs[l]), atol=1e-12, rtol=0)
    recon = tcs.reconstruct(xs) if n_targets else [tc(x) for tc, x in zip(tcs, xs)]
    for m, (got, want) in enumerate(zip(recon, sparsify_outputs(coders, xs))):
        assert torch.allclose(got, want, atol=1e-12, rtol=0), m
    with pytest.raises(ValueError, match="no circuit-tracer file"):
        convert_to_circuit_tracer(tcs, tmp_path / "ct")

    model = relu_model("LN", seed=3, n_layers=3, d_model=D)
    tokens = torch.arange(8)
    g = attribution_graph(model, tcs, tokens, max_logits=3)
    bf = SparsifyFrozen(model, coders, tokens)
    base = bf.targets(g, *bf.run())
    rows = _rows(g)
    assert torch.allclose(g.values[rows], base, atol=1e-9, rtol=0)
    full = sparsify_outputs(coders, bf.x)
    assert torch.allclose(g.errors, torch.stack(bf.out) - torch.stack(full), atol=1e-9, rtol=0)
    at_zero = (g.activations == 0).nonzero()[:, 0].tolist()
    assert at_zero, "some selected latent at activation 0 (fewer than k positive): its write is its post_enc's alone"
    feats = at_zero[:3] + [n for n in range(g.n_features) if int(g.features[n, 0]) < 2 and g.activations[n] > 0][:4]
    def write(n):  # a feature's write into every output: sparsify's outputs with and without it
        return torch.stack(full) - torch.stack(sparsify_outputs(coders, bf.x, drop=g.features[n].tolist()))

    nodes = feats + [g.error_node(0, 4), g.error_node(1, 7), g.token_node(2), g.token_node(6)]
    assert_columns(bf, g, nodes, write, base, 1e-9)
    assert torch.allclose(g.adjacency[rows].sum(1) + g.bias[rows] + g.unselected[rows], base, atol=1e-9, rtol=0)
    assert intervene(model, tcs, g, feats[:4], scale=3.0).gap < 1e-9
    with pytest.raises(ValueError, match="post-encoder bias"):
        intervene(model, tcs, g, feats[:1], value=1.0)
    # live: the feature's write in this run, (a' + c s') W_dec by sparsify's own sums, replaced by 3 (a + c) W_dec
    n = at_zero[0]
    live = intervene(model, tcs, g, [n], scale=3.0, frozen=False)
    assert torch.allclose(live.after, _sparsify_live(bf, coders, g, g.features[n].tolist(), 3.0), atol=1e-9, rtol=0)
    assert float((live.after - base).abs().max()) > 1e-3
    # position 0 zeroed (circuit-tracer's convention): rows checked as built, the frozen intervention exact
    z = attribution_graph(model, tcs, tokens, max_logits=3, zero_positions=[0])
    zeros = [m for m in range(z.n_features) if z.activations[m] == 0][:2]
    assert zeros and intervene(model, tcs, z, zeros, scale=2.0).gap < 1e-9
    # the QK tables: each query's and key's parts (post-encoder writes, skips into later layers) sum to the run's
    for a in qk_attributions(model, tcs, z, k=2):
        assert abs(float(a.table.sum()) - a.score) < 1e-9


def _sparsify_live(bf, coders, graph, feature, factor):
    """The targets of the model's own run (nothing frozen) where sparsify's latent ``feature`` (layer, pos, index)
    writes ``factor`` times its clean write: each MLP output plus that minus its write in this run, both by
    :func:`sparsify_outputs` with and without it, on the clean and on this run's inputs."""
    model, L = bf.model, len(coders)
    box, scales = {}, {}
    write = lambda xs, m: (sparsify_outputs(coders[: m + 1], xs[: m + 1])[m]  # noqa: E731
                           - sparsify_outputs(coders[: m + 1], xs[: m + 1], drop=feature)[m])

    def mlp_out(t, hook):
        m = int(hook.name.split(".")[1])
        box[m] = _mlp_input(model, m, box[("r", m)], scales[m])[0]  # this run's MLP input, its own scale
        return t + (factor * write(bf.x, m) - write([box[i] for i in range(m + 1)], m))[None]

    hooks = ([(f"blocks.{k}.hook_resid_mid", lambda t, hook, k=k: box.__setitem__(("r", k), t)) for k in range(L)]
             + [(f"blocks.{k}.ln2.hook_scale", lambda t, hook, k=k: scales.__setitem__(k, t)) for k in range(L)]
             + [(f"blocks.{k}.hook_mlp_out", mlp_out) for k in range(L)])
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(bf.tokens)[0]
    return bf.targets(graph, [box[k] for k in range(L)], logits)


def test_circuit_tracers_topk_is_read_as_circuit_tracers(tmp_path):
    """A set written as circuit-tracer's keeps its TopK (negative pre-activations kept): not sparsify's."""
    from tests.features.test_transcoders import random_transcoders

    tcs = random_transcoders(2, D, W, activation="topk", k=4)
    back = load_transcoders(convert_to_circuit_tracer(tcs, tmp_path / "ct"), dtype=torch.float64)
    assert back[0].activation == "topk"


@pytest.mark.parametrize("what, cfg, match", [
    ("groupmax", dict(activation="groupmax"), "groupmax"),
    ("coalesced top-k", dict(coalesce_topk="concat"), "coalesce_topk 'concat'"),
    ("an autoencoder", dict(transcode=False), "autoencoder"),
])
def test_what_sparsify_writes_and_rs_interp_does_not_compute_is_refused_by_name(tmp_path, what, cfg, match):
    _coders(tmp_path / "sp", "clt", **cfg)
    with pytest.raises(ValueError, match=match):
        load_sparsify_transcoders(tmp_path / "sp")


def test_unknown_fields_and_tensors_are_refused_by_name(tmp_path):
    _coders(tmp_path / "a", "main", L=2)
    sub = tmp_path / "a" / "layers.1.mlp"
    cfg = json.loads((sub / "cfg.json").read_text())
    (sub / "cfg.json").write_text(json.dumps(cfg | {"signed": True}))
    with pytest.raises(ValueError, match="'signed', fields rs_interp does not read"):
        load_sparsify_transcoders(tmp_path / "a")
    (sub / "cfg.json").write_text(json.dumps(cfg))
    sd = load_file(str(sub / "sae.safetensors"))
    save_file(sd | {"W_gate": torch.zeros(2)}, str(sub / "sae.safetensors"))
    with pytest.raises(ValueError, match="tensor 'W_gate', which rs_interp does not read"):
        load_sparsify_transcoders(tmp_path / "a")
    save_file(sd, str(sub / "sae.safetensors"))
    with pytest.raises(ValueError, match="no hook-point folder"):
        load_sparsify_transcoders(sub)


@pytest.mark.parametrize("key, flag", [("W_skip", "skip_connection"), ("post_enc_scale", "post_encoder_scale")])
def test_a_tensor_its_config_does_not_make_is_refused_by_name(tmp_path, key, flag):
    """sparsify's own strict load refuses a tensor its config makes no parameter for: so does the reader, naming
    both (it would otherwise be read or dropped on a guess)."""
    _coders(tmp_path / "a", "clt", L=1, skip=False)
    sub = tmp_path / "a" / "layers.0.mlp"
    sd = load_file(str(sub / "sae.safetensors"))
    save_file(sd | {key: torch.zeros(D, D) if key == "W_skip" else torch.ones(D)}, str(sub / "sae.safetensors"))
    with pytest.raises(ValueError, match=f"'{key}' saved but {flag} is false"):
        load_sparsify_transcoders(tmp_path / "a")
