"""Other libraries' transcoder files, read into rs_interp's sets (and so written as circuit-tracer's).

- **pchlenski's GPT-2 transcoders** (Dunefsky et al.'s ``transcoder_circuits``, on the Hub as
  ``pchlenski/gpt2-transcoders``): one ``.pt`` a layer, a pickled ``{"cfg": <sae_training config>,
  "state_dict": {...}}`` whose config names the hook it reads (``blocks.{l}.ln2.hook_normalized``) and
  whose tensors are ``W_enc`` (d_in, d_sae), ``b_enc``, ``W_dec`` (d_sae, d_out), ``b_dec`` (d_in, taken
  from the input first) and ``b_dec_out`` (d_out). A ReLU transcoder:
  ``f = relu((x - b_dec) W_enc + b_enc)``, ``y = f W_dec + b_dec_out``; in rs_interp's terms
  ``W_enc^T``, ``b_enc - b_dec W_enc``, ``W_dec``, ``b_dec_out``, reading ``ln2.hook_normalized``.
  The config's class is not needed: it is read as a plain record.
- **EleutherAI's sparsify** transcoders (its ``SparseCoder.save_to_disk``, on main and on its ``clt`` branch): a
  folder a hook point (``layers.{l}.mlp`` ...) with ``cfg.json`` (every field of its ``SparseCoderConfig``, and
  ``d_in``) and ``sae.safetensors`` (``encoder.weight`` (latents, d_in), ``encoder.bias``; ``W_dec`` (latents,
  d_in), ``b_dec``, ``W_skip``, ``post_enc``, or for a cross-layer coder ``W_decs.{j}``, ``b_decs.{j}``,
  ``W_skips.{j}``, ``post_encs.{j}``, its writes into the MLP output ``j`` layers on; ``post_enc_scale(s)``,
  ``in_norm``, ``out_norm`` where the config asks). TopK is sparsify's: ``f = topk(relu(x W_enc^T + b_enc))``,
  the activation ``relu_topk`` (circuit-tracer's TopK keeps negative pre-activations: where fewer than ``k`` are
  positive the two differ, so such a set has no circuit-tracer file). A cross-layer coder becomes a
  :class:`~rs_interp.features.CrossLayerTranscoder`, each layer's writes summed as sparsify's cross-layer runner
  sums them, skips into later layers (``W_skips.{j > 0}``) included. A post-encoder bias (``post_enc(s)``, added to
  each latent the TopK selects, zeros among them) is kept as the transcoders' ``post_bias``. Every field and tensor
  is read or refused by name (:func:`_read_coder`).

:func:`convert_to_circuit_tracer` writes either as circuit-tracer's files (per-layer ``layer_{i}.safetensors``
and ``config.yaml``, or its CLT layout), sparsify's TopK refused by name.
"""

from __future__ import annotations

import pickle
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .. import _names as N
from .._files import existing, loading, read_json, read_safetensors, reads
from .._messages import few
from .clt import CrossLayerTranscoder
from .transcoders import Transcoder, TranscoderSet

__all__ = ["load_pchlenski_transcoders", "load_sparsify_transcoders", "convert_to_circuit_tracer"]


class _Record:
    """Any pickled object of a package not installed here (the ``sae_training`` config): its attributes only."""

    def __setstate__(self, state) -> None:
        self.__dict__.update(state if isinstance(state, dict) else {})


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module.split(".")[0] in ("sae_training", "transcoder_circuits", "sae_lens"):
            return type(name, (_Record,), {})
        return super().find_class(module, name)


_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, load=lambda f, **kw: _Unpickler(f, **kw).load(),
                                __name__="rs_interp_pickle")


def _field(cfg, name: str, default=None):
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


#: The tensors transcoder_circuits' ``SparseAutoencoder.save_model`` writes for a transcoder (its ``state_dict``).
_PCHLENSKI_TENSORS = ("W_enc", "b_enc", "W_dec", "b_dec", "b_dec_out")


@reads("pchlenski transcoder files")
def load_pchlenski_transcoders(files: Sequence[str | Path], *, dtype: torch.dtype = torch.float32) -> TranscoderSet:
    """Read pchlenski's GPT-2 transcoders (module docstring), one file a layer, in layer order.

    Raises:
        rs_interp.FileError: (a ``ValueError``, naming the file) a file missing, truncated or not a PyTorch file,
            one without ``cfg`` and ``state_dict``, an autoencoder (``is_transcoder`` false), a tensor
            missing or one it does not read (named), a config reading another hook than
            ``blocks.{l}.ln2.hook_normalized`` for its place ``l``, or writing elsewhere than the MLP output.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); path = os.path.join(d, "t0.pt")
    >>> torch.save({"cfg": {"hook_point": "blocks.0.ln2.hook_normalized", "d_in": 4, "d_out": 4},
    ...             "state_dict": {"W_enc": torch.ones(4, 8), "b_enc": torch.zeros(8), "W_dec": torch.ones(8, 4),
    ...                            "b_dec": torch.zeros(4), "b_dec_out": torch.zeros(4)}}, path)
    >>> tcs = load_pchlenski_transcoders([path]); tcs.input_point, tcs[0].d_transcoder
    ('ln2.hook_normalized', 8)
    """
    out = []
    for l, f in enumerate(files):
        with loading(existing(f, "pchlenski transcoder file"), "pchlenski transcoder file", "torch.load"):
            data = torch.load(str(f), map_location="cpu", weights_only=False, pickle_module=_PICKLE)
        if not isinstance(data, dict) or "state_dict" not in data or "cfg" not in data:
            raise ValueError(f"{f}: not a transcoder_circuits file (a dict with 'cfg' and 'state_dict')")
        cfg, sd = data["cfg"], data["state_dict"]
        if _field(cfg, "is_transcoder", True) is False:
            raise ValueError(f"{f}: is_transcoder is false, a sparse autoencoder, not a transcoder")
        missing = set(_PCHLENSKI_TENSORS) - set(sd)
        if missing:
            raise ValueError(f"{f}: the state dict lacks {few(sorted(missing))}")
        extra = sorted(set(sd) - set(_PCHLENSKI_TENSORS))
        if extra:
            raise ValueError(f"{f}: the state dict holds {few(extra)}, which rs_interp does not read "
                             "(transcoder_circuits' SparseAutoencoder saves W_enc, b_enc, W_dec, b_dec, b_dec_out)")
        hook = str(_field(cfg, "hook_point", ""))
        if hook != N.normalized(l, "ln2"):
            raise ValueError(f"{f}: reads {hook!r}; as layer {l} of the set it must read {N.normalized(l, 'ln2')}")
        out_hook = _field(cfg, "out_hook_point", None)
        if out_hook not in (None, N.mlp_out(l)):
            raise ValueError(f"{f}: writes {out_hook!r}, not {N.mlp_out(l)}")
        W_enc, b_enc, b_dec = (sd[k].to(torch.float64) for k in ("W_enc", "b_enc", "b_dec"))
        state = {"W_enc": W_enc.T, "b_enc": b_enc - b_dec @ W_enc, "W_dec": sd["W_dec"], "b_dec": sd["b_dec_out"]}
        out.append(Transcoder.from_state(state, activation="relu", dtype=dtype))
    return TranscoderSet(tuple(out), "ln2.hook_normalized", "mlp.hook_out", "pchlenski/gpt2-transcoders")


#: Every field sparsify's ``SparseCoderConfig`` writes to ``cfg.json`` (on main, and on its ``clt`` branch: the
#: cross-layer fields), and ``d_in``: what each means for a coder's function is read or refused in :func:`_read_coder`.
SPARSIFY_CONFIG = frozenset({
    "d_in", "activation", "expansion_factor", "normalize_decoder", "num_latents", "k", "multi_topk", "skip_connection",
    "transcode", "n_targets", "n_sources", "normalize_io", "divide_cross_layer", "train_post_encoder",
    "post_encoder_scale", "coalesce_topk", "topk_coalesced"})
#: The tensors sparsify's ``SparseCoder`` saves (its ``state_dict``): one per coder, or one per target ``j``.
_SPARSIFY_TENSOR = re.compile(r"(encoder\.weight|encoder\.bias|W_dec|b_dec|W_skip|post_enc|post_enc_scale|in_norm"
                              r"|out_norm)|(W_decs|b_decs|W_skips|post_encs|post_enc_scales)\.(\d+)")


@dataclass(frozen=True)
class _Target:
    """One target ``j`` of a sparsify coder (float64): its decoder (post-encoder scale folded in), bias, skip (input
    norm folded in; None: none) and post-encoder bias (None: none, or all zero)."""

    decoder: torch.Tensor
    bias: torch.Tensor
    skip: torch.Tensor | None
    post_bias: torch.Tensor | None


@dataclass(frozen=True)
class _Coder:
    """One hook point's sparsify coder as rs_interp reads it (float64): the encoder with the input norm folded in,
    its targets (:class:`_Target`), the output norm's scale and whether earlier layers' writes into this layer are
    divided by their number."""

    W_enc: torch.Tensor
    b_enc: torch.Tensor
    k: int
    targets: list[_Target]
    out_scale: float
    divide: bool


def _refuse_unknown(sub: Path, cfg: dict, sd: dict[str, torch.Tensor], n_targets: int) -> None:
    unknown = sorted(set(cfg) - SPARSIFY_CONFIG)
    if unknown:
        raise ValueError(f"{sub}/cfg.json: {few(unknown)}, fields rs_interp does not read (not sparsify's "
                         "SparseCoderConfig's)")
    for key in sd:
        m = _SPARSIFY_TENSOR.fullmatch(key)
        if m is None or (m.group(3) is not None and int(m.group(3)) >= max(n_targets, 1)):
            raise ValueError(f"{sub}/sae.safetensors: tensor {key!r}, which rs_interp does not read (a sparsify coder "
                             f"with {n_targets} targets saves encoder.*, W_dec(s), b_dec(s), W_skip(s), post_enc(s), "
                             "post_enc_scale(s), in_norm, out_norm)")


def _refuse_settings(sub: Path, cfg: dict, sd: dict[str, torch.Tensor]) -> None:
    # sparsify's own load_state_dict (strict) refuses a tensor its config does not make: so does rs_interp, by name
    for flag, prefix in (("skip_connection", "W_skip"), ("post_encoder_scale", "post_enc_scale")):
        extra = sorted(key for key in sd if key.startswith(prefix))
        if extra and not cfg.get(flag, False):
            raise ValueError(f"{sub}: {few(extra)} saved but {flag} is false (sparsify would not load it)")
    if not cfg.get("transcode", False):
        raise ValueError(f"{sub}: transcode is false, a sparse autoencoder, not a transcoder")
    if cfg.get("activation", "topk") != "topk":
        raise ValueError(f"{sub}: activation {cfg.get('activation')!r}; rs_interp reads sparsify's TopK coders "
                         "(groupmax, the largest of each of k groups, is not read)")
    if cfg.get("coalesce_topk", "none") not in ("none", None):
        raise ValueError(f"{sub}: coalesce_topk {cfg['coalesce_topk']!r}, the top k chosen across the layers' latents "
                         "together, which no per-layer encoder of rs_interp's computes (only 'none' is read)")


def _tensor(sd: dict[str, torch.Tensor], sub: Path, key: str, shape: tuple[int, ...]) -> torch.Tensor:
    if key not in sd:
        raise ValueError(f"{sub}: sae.safetensors lacks {key!r}")
    if tuple(sd[key].shape) != shape:
        raise ValueError(f"{sub}: {key} has shape {tuple(sd[key].shape)}, expected {shape}")
    return sd[key].to(torch.float64)


def _nonzero(sd: dict[str, torch.Tensor], key: str) -> bool:
    return key in sd and bool(sd[key].ne(0).any())


def _target(sub: Path, cfg: dict, sd: dict[str, torch.Tensor], j: int, s_in: float, n_latents: int) -> _Target:
    """Target ``j``: the post-encoder scale folded into the decoder (``(a + c) * scale`` on the selected latents: a
    scaled decoder row), the input norm into the skip (which reads the normalised input); the post-encoder bias
    ``c`` kept where nonzero (all zero: none, the transcoder of the files sparsify writes untrained)."""
    multi = int(cfg.get("n_targets", 0) or 0) > 0
    W, b, skip, pe, scale = ((f"W_decs.{j}", f"b_decs.{j}", f"W_skips.{j}", f"post_encs.{j}", f"post_enc_scales.{j}")
                             if multi else ("W_dec", "b_dec", "W_skip", "post_enc", "post_enc_scale"))
    d = int(cfg["d_in"])
    decoder = _tensor(sd, sub, W, (n_latents, d))
    if cfg.get("post_encoder_scale", False):
        decoder = _tensor(sd, sub, scale, (n_latents,))[:, None] * decoder
    post = _tensor(sd, sub, pe, (n_latents,)) if _nonzero(sd, pe) else None
    skip_W = s_in * _tensor(sd, sub, skip, (d, d)) if skip in sd else None
    return _Target(decoder, _tensor(sd, sub, b, (d,)), skip_W, post)


def _read_coder(sub: Path) -> _Coder:
    """One hook point's coder (EleutherAI sparsify's ``SparseCoder``, main at 9d3b136 and its ``clt`` branch at
    d7f7368): ``a = topk(relu(x' W_enc^T + b_enc))`` of ``x' = x sqrt(d_in) / in_norm`` (``normalize_io``); for target
    ``j`` the write ``(a + post_encs[j]) * post_enc_scales[j]`` (on the ``k`` latents ``topk`` selects, zeros among
    them where fewer than ``k`` are positive: ``MidDecoder.current_latent_acts``) through ``W_decs[j]`` plus
    ``b_decs[j]`` and ``x' W_skips[j]^T``; the target's sum times ``out_norm / sqrt(d_in)``. The post-encoder biases
    are read as saved: the function the coder computed when trained and saved. (sparsify's own
    ``SparseCoder.load_state``, at d7f7368 and in EleutherAI/clt-training at a1d8ef7, replaces a multi-target coder's
    saved ``post_encs.{j}`` by fresh zeros: it tests for a key ``"post_encs"`` that no saver writes; a coder loaded
    by it computes as if they were zero.)

    Raises:
        ValueError: a field or tensor it does not read (named), a setting no transcoder of rs_interp's computes
            (an autoencoder, groupmax, coalesced top-k), a tensor its config does not make (a skip without
            ``skip_connection``, post-encoder scales without ``post_encoder_scale``: sparsify would not load it),
            a tensor missing.
    """
    cfg = read_json(sub / "cfg.json", "sparsify config")
    sd = read_safetensors(sub / "sae.safetensors", "sparsify transcoder file")
    n = int(cfg.get("n_targets", 0) or 0)
    _refuse_unknown(sub, cfg, sd, n)
    _refuse_settings(sub, cfg, sd)
    d_in, norm = int(cfg["d_in"]), bool(cfg.get("normalize_io", False))
    if not norm and ({"in_norm", "out_norm"} & set(sd)):
        raise ValueError(f"{sub}: in_norm/out_norm saved but normalize_io is false")
    s_in = d_in**0.5 / float(_tensor(sd, sub, "in_norm", (1,))) if norm else 1.0
    out_scale = float(_tensor(sd, sub, "out_norm", (1,))) / d_in**0.5 if norm else 1.0
    n_latents = int(sd["encoder.weight"].shape[0]) if "encoder.weight" in sd else 0
    W_enc = _tensor(sd, sub, "encoder.weight", (n_latents, d_in))
    targets = [_target(sub, cfg, sd, j, s_in, n_latents) for j in range(max(n, 1))]
    return _Coder(s_in * W_enc, _tensor(sd, sub, "encoder.bias", (n_latents,)), int(cfg["k"]), targets, out_scale,
                  bool(cfg.get("divide_cross_layer", False)))


def _into(coders: list[_Coder], m: int) -> tuple[list[tuple[int, float]], torch.Tensor]:
    """Layer ``m``'s output as sparsify's cross-layer runner sums it: ``[(source l, its weight)]`` (``out_scale`` of
    ``m``; an earlier source's write, its skip's included, divided by their number where ``m`` divides), and the
    bias, scaled."""
    c = coders[m]
    earlier = [l for l in range(m) if m - l < len(coders[l].targets)]
    div = max(1, len(earlier)) if c.divide else 1
    weights = [(l, c.out_scale / div) for l in earlier] + [(m, c.out_scale)]
    bias = torch.zeros(c.W_enc.shape[1], dtype=torch.float64)
    for l, w in weights:
        bias = bias + w * coders[l].targets[m - l].bias
    return weights, bias


def _cross_layer(coders: list[_Coder], into: list[list[tuple[int, float]]]) -> tuple[list, list | None, list | None]:
    """Per source layer ``l``, from sparsify's coders and each output's weights (:func:`_into`): the decoders
    (d_transcoder, L - l, d_model) scaled as the runner scales them, the skips (L - l, d, d; None unless a skip into
    a later layer is nonzero: the layer's own then stands as its ``W_skip``) and the post-encoder biases
    (d_transcoder, L - l; None unless one is nonzero)."""
    L, d = len(coders), coders[0].W_enc.shape[1]
    crossing = any(t.skip is not None and bool(t.skip.ne(0).any()) for c in coders for t in c.targets[1:])
    posting = any(t.post_bias is not None for c in coders for t in c.targets)
    decoders = [torch.zeros(c.W_enc.shape[0], L - l, d, dtype=torch.float64) for l, c in enumerate(coders)]
    skips = [torch.zeros(L - l, d, d, dtype=torch.float64) if crossing and c.targets[0].skip is not None else None
             for l, c in enumerate(coders)]
    posts = [torch.zeros(c.W_enc.shape[0], L - l, dtype=torch.float64) for l, c in enumerate(coders)]
    for m, weights in enumerate(into):
        for l, w in weights:
            target = coders[l].targets[m - l]
            decoders[l][:, m - l] = w * target.decoder
            if target.skip is not None and skips[l] is not None:
                skips[l][m - l] = w * target.skip
            if target.post_bias is not None:
                posts[l][:, m - l] = target.post_bias  # (a + c) (w W): the weight scales the decoder, not c
    posts = [c if bool(c.ne(0).any()) else None for c in posts]  # a layer with none: its nodes as without any
    return decoders, skips if crossing else None, posts if posting else None


@reads("sparsify transcoder folder")
def load_sparsify_transcoders(folder: str | Path, *, hookpoints: Sequence[str] | None = None,
                              dtype: torch.dtype = torch.float32) -> TranscoderSet:
    """Read EleutherAI sparsify's transcoders (module docstring) from ``folder``'s hook-point subfolders, in
    layer order (the first number in each name), or the ``hookpoints`` named: each coder's activation
    ``relu_topk`` (sparsify's TopK, the ``k`` largest of ``relu(pre)``), its input and output norms and
    post-encoder scales folded into the weights, a cross-layer coder's writes into each layer summed as
    sparsify's cross-layer runner sums them (``divide_cross_layer`` included), its post-encoder biases kept as
    the transcoders' ``post_bias`` (added to each selected latent) and its skips into later layers as the
    cross-layer transcoder's ``skips``.

    Raises:
        rs_interp.FileError: (a ``ValueError``, naming the file or folder) a file missing, truncated or malformed;
            a field or tensor rs_interp does not read, named; a coder that is not a transcoder
            (``transcode`` false: an autoencoder), not TopK (groupmax), with coalesced top-k (:func:`_read_coder`);
            a tensor missing; layers of different ``k``; cross-layer targets past the last layer.

    >>> import tempfile, json, os
    >>> from safetensors.torch import save_file
    >>> d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, "layers.0.mlp"))
    >>> cfg = json.dumps({"d_in": 4, "k": 2, "transcode": True})
    >>> _ = open(os.path.join(d, "layers.0.mlp", "cfg.json"), "w").write(cfg)
    >>> save_file({"encoder.weight": torch.ones(8, 4), "encoder.bias": torch.zeros(8), "W_dec": torch.ones(8, 4),
    ...            "b_dec": torch.zeros(4)}, os.path.join(d, "layers.0.mlp", "sae.safetensors"))
    >>> tcs = load_sparsify_transcoders(d); tcs[0].k, tcs[0].activation, tcs.input_point
    (2, 'relu_topk', 'mlp.hook_in')
    """
    folder = Path(folder)
    if hookpoints is None:
        subs = [p for p in folder.iterdir() if (p / "cfg.json").is_file()]
        number = lambda p: int(m.group()) if (m := re.search(r"\d+", p.name)) else -1  # noqa: E731
        subs = sorted(subs, key=number)
    else:
        subs = [folder / h for h in hookpoints]
    if not subs:
        raise ValueError(f"{folder} holds no hook-point folder with a cfg.json (sparsify's layout)")
    coders = [_read_coder(sub) for sub in subs]
    L = len(coders)
    for l, (sub, c) in enumerate(zip(subs, coders)):
        if l + len(c.targets) > L:
            raise ValueError(f"{sub}: {len(c.targets)} targets from layer {l} pass the last layer ({L - 1})")
        if c.k != coders[0].k:
            raise ValueError(f"{sub}: k {c.k}, the others {coders[0].k} (one k for the set)")
    into = [_into(coders, m) for m in range(L)]
    decoders, skips, posts = _cross_layer(coders, [weights for weights, _ in into])
    # each layer's own skip, scaled by its output norm (the cross-layer ones in skips)
    own = [None if c.targets[0].skip is None else c.out_scale * c.targets[0].skip for c in coders]
    k, scan = coders[0].k, f"sparsify/{folder.name}"
    if all(len(c.targets) == 1 for c in coders):
        states = [{"W_enc": c.W_enc, "b_enc": c.b_enc, "W_dec": D[:, 0], "b_dec": bias}
                  | ({"W_skip": skip} if skip is not None else {})
                  | ({"post_bias": c.targets[0].post_bias} if c.targets[0].post_bias is not None else {})
                  for c, D, (_, bias), skip in zip(coders, decoders, into, own)]
        tcs = tuple(Transcoder.from_state(state, activation="relu_topk", k=k, dtype=dtype) for state in states)
        return TranscoderSet(tcs, "mlp.hook_in", "mlp.hook_out", scan)
    return CrossLayerTranscoder.from_tensors([c.W_enc for c in coders], [c.b_enc for c in coders], decoders,
                                             [bias for _, bias in into], activation="relu_topk", k=k,
                                             W_skip=own if skips is None else None, skips=skips, post_biases=posts,
                                             input_point="mlp.hook_in", scan=scan, dtype=dtype)


def convert_to_circuit_tracer(transcoders: TranscoderSet, folder: str | Path) -> Path:
    """Write ``transcoders`` (from any reader here) as circuit-tracer's files: its per-layer set
    (``layer_{i}.safetensors``, ``config.yaml``) or, for a cross-layer transcoder, its CLT layout.

    >>> import tempfile
    >>> out = convert_to_circuit_tracer(TranscoderSet((Transcoder(4, 8),)), tempfile.mkdtemp())
    >>> sorted(p.name for p in out.iterdir())
    ['config.yaml', 'layer_0.safetensors']
    """
    return transcoders.save(folder)
