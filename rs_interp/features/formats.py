"""Other libraries' transcoder files, read into rs_interp's sets (and so written as circuit-tracer's).

- **pchlenski's GPT-2 transcoders** (Dunefsky et al.'s ``transcoder_circuits``, on the Hub as
  ``pchlenski/gpt2-transcoders``): one ``.pt`` a layer, a pickled ``{"cfg": <sae_training config>,
  "state_dict": {...}}`` whose config names the hook it reads (``blocks.{l}.ln2.hook_normalized``) and
  whose tensors are ``W_enc`` (d_in, d_sae), ``b_enc``, ``W_dec`` (d_sae, d_out), ``b_dec`` (d_in, taken
  from the input first) and ``b_dec_out`` (d_out). A ReLU transcoder:
  ``f = relu((x - b_dec) W_enc + b_enc)``, ``y = f W_dec + b_dec_out``; in rs_interp's terms
  ``W_enc^T``, ``b_enc - b_dec W_enc``, ``W_dec``, ``b_dec_out``, reading ``ln2.hook_normalized``.
  The config's class is not needed: it is read as a plain record.
- **EleutherAI's sparsify** transcoders: a folder a hook point (``layers.{l}.mlp`` ...) with ``cfg.json``
  (``d_in``, ``k``, ``transcode``, ``skip_connection``, ``n_targets``) and ``sae.safetensors``
  (``encoder.weight`` (latents, d_in), ``encoder.bias``; ``W_dec`` (latents, d_in) and ``b_dec``, or for a
  cross-layer coder ``W_decs.{j}`` and ``b_decs.{j}``, its decoder into the MLP output ``j`` layers on;
  ``W_skip``). TopK: ``f = topk(x W_enc^T + b_enc)``. A cross-layer coder becomes a
  :class:`~rs_interp.features.CrossLayerTranscoder` (each layer's ``b_dec`` the sum of the ``b_decs`` that
  reach it).

:func:`convert_to_circuit_tracer` writes either as circuit-tracer's files (per-layer ``layer_{i}.safetensors``
and ``config.yaml``, or its CLT layout).
"""

from __future__ import annotations

import pickle
import re
import types
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


_PICKLE = types.SimpleNamespace(Unpickler=_Unpickler, load=lambda f, **kw: _Unpickler(f, **kw).load(), __name__="rs_interp_pickle")


def _field(cfg, name: str, default=None):
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


@reads("pchlenski transcoder files")
def load_pchlenski_transcoders(files: Sequence[str | Path], *, dtype: torch.dtype = torch.float32) -> TranscoderSet:
    """Read pchlenski's GPT-2 transcoders (module docstring), one file a layer, in layer order.

    Raises:
        rs_interp.FileError: (a ``ValueError``, naming the file) a file missing, truncated or not a PyTorch file,
            one without ``cfg`` and ``state_dict``, a tensor missing or of the wrong shape, a config reading another
            hook than ``blocks.{l}.ln2.hook_normalized`` for its place ``l``, or writing elsewhere than the MLP output.

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
        missing = {"W_enc", "b_enc", "W_dec", "b_dec", "b_dec_out"} - set(sd)
        if missing:
            raise ValueError(f"{f}: the state dict lacks {few(sorted(missing))}")
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


@reads("sparsify transcoder folder")
def load_sparsify_transcoders(folder: str | Path, *, hookpoints: Sequence[str] | None = None,
                              dtype: torch.dtype = torch.float32) -> TranscoderSet:
    """Read EleutherAI sparsify's transcoders (module docstring) from ``folder``'s hook-point subfolders, in
    layer order (the first number in each name), or the ``hookpoints`` named.

    Raises:
        rs_interp.FileError: (a ``ValueError``, naming the file or folder) a file missing, truncated or malformed,
            a coder that is not a transcoder (``transcode`` false: an autoencoder), not TopK, with a
            post-encoder scale (not read), a tensor missing, or cross-layer targets past the last layer.

    >>> import tempfile, json, os
    >>> from safetensors.torch import save_file
    >>> d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, "layers.0.mlp"))
    >>> _ = open(os.path.join(d, "layers.0.mlp", "cfg.json"), "w").write(json.dumps({"d_in": 4, "k": 2, "transcode": True}))
    >>> save_file({"encoder.weight": torch.ones(8, 4), "encoder.bias": torch.zeros(8), "W_dec": torch.ones(8, 4),
    ...            "b_dec": torch.zeros(4)}, os.path.join(d, "layers.0.mlp", "sae.safetensors"))
    >>> tcs = load_sparsify_transcoders(d); tcs[0].k, tcs.input_point
    (2, 'mlp.hook_in')
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
    L = len(subs)
    enc, dec, b_dec, skips, k = [], [], [], [], None
    for l, sub in enumerate(subs):
        cfg = read_json(sub / "cfg.json", "sparsify config")
        sd = read_safetensors(sub / "sae.safetensors", "sparsify transcoder file")
        if not cfg.get("transcode", False):
            raise ValueError(f"{sub}: transcode is false, a sparse autoencoder, not a transcoder")
        if cfg.get("activation", "topk") != "topk":
            raise ValueError(f"{sub}: activation {cfg.get('activation')!r}; rs_interp reads sparsify's TopK coders")
        if any(key.startswith("post_enc") for key in sd) or cfg.get("post_encoder_scale"):
            raise ValueError(f"{sub}: a post-encoder scale, which rs_interp does not read")
        if k is not None and cfg["k"] != k:
            raise ValueError(f"{sub}: k {cfg['k']}, the others {k} (one k for the set)")
        k = int(cfg["k"])
        lacking = {"encoder.weight", "encoder.bias"} - set(sd)
        if lacking:
            raise ValueError(f"{sub}: sae.safetensors lacks {few(sorted(lacking))}")
        enc.append((sd["encoder.weight"], sd["encoder.bias"]))
        n_targets = int(cfg.get("n_targets", 0) or 0)
        if n_targets:
            if l + n_targets > L:
                raise ValueError(f"{sub}: {n_targets} targets from layer {l} pass the last layer ({L - 1})")
            dec.append(torch.stack([sd[f"W_decs.{j}"] for j in range(n_targets)], 1))
            b_dec.append([sd.get(f"b_decs.{j}", torch.zeros(sd["encoder.weight"].shape[1])) for j in range(n_targets)])
        else:
            dec.append(sd["W_dec"][:, None])
            b_dec.append([sd["b_dec"]])
        skips.append(sd.get("W_skip"))
    widths = {d.shape[1] for d in dec}
    if widths == {1}:
        tcs = tuple(Transcoder.from_state({"W_enc": W, "b_enc": b, "W_dec": D[:, 0], "b_dec": bd[0]} | ({"W_skip": s} if s is not None else {}),
                                          activation="topk", k=k, dtype=dtype)
                    for (W, b), D, bd, s in zip(enc, dec, b_dec, skips))
        return TranscoderSet(tcs, "mlp.hook_in", "mlp.hook_out", f"sparsify/{folder.name}")
    # cross-layer: pad each source's decoders to every later layer (zeros past its targets), sum the biases into each layer
    d_model = enc[0][0].shape[1]
    decoders, out_bias = [], [torch.zeros(d_model, dtype=torch.float64) for _ in range(L)]
    for l, (D, bd) in enumerate(zip(dec, b_dec)):
        full = torch.zeros(D.shape[0], L - l, d_model, dtype=D.dtype)
        full[:, : D.shape[1]] = D
        decoders.append(full)
        for j, b in enumerate(bd):
            out_bias[l + j] += b.to(torch.float64)
    return CrossLayerTranscoder.from_tensors([W for W, _ in enc], [b for _, b in enc], decoders, out_bias, activation="topk", k=k,
                                             W_skip=skips, input_point="mlp.hook_in", scan=f"sparsify/{folder.name}", dtype=dtype)


def convert_to_circuit_tracer(transcoders: TranscoderSet, folder: str | Path) -> Path:
    """Write ``transcoders`` (from any reader here) as circuit-tracer's files: its per-layer set
    (``layer_{i}.safetensors``, ``config.yaml``) or, for a cross-layer transcoder, its CLT layout.

    >>> import tempfile
    >>> out = convert_to_circuit_tracer(TranscoderSet((Transcoder(4, 8),)), tempfile.mkdtemp())
    >>> sorted(p.name for p in out.iterdir())
    ['config.yaml', 'layer_0.safetensors']
    """
    return transcoders.save(folder)
