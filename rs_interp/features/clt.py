"""Cross-layer transcoders (CLTs): a feature reads the MLP input of one layer and writes to the MLP
output of that layer *and every later one* (Ameisen et al. 2025; circuit-tracer's published graphs).

With ``x_l`` the transcoder input of layer ``l`` (as for per-layer transcoders, :mod:`.transcoders`):

    a_l = act(x_l W_enc[l]^T + b_enc[l])                                 (d_transcoder,)
    y_hat_m = sum_{l <= m} (a_l + c[l][:, m - l] s_l) W_dec[l][:, m - l] + b_dec[m]
              + sum_{l <= m} x_l W_skip[l][m - l]^T

``W_dec[l]`` is (d_transcoder, n_layers - l, d_model): feature ``i`` of layer ``l`` writes
``a W_dec[l][i, m - l]`` into MLP output ``m``. Two optional terms (EleutherAI sparsify's cross-layer coders
have both): ``skips[l]`` (n_layers - l, d_model, d_model), ``W_skip[l][j]`` the linear skip from layer ``l``'s
input into MLP output ``l + j`` (``j = 0`` the layer's own ``W_skip``; without ``skips``, that one only), and
``post_biases[l]`` (d_transcoder, n_layers - l), the post-encoder bias ``c`` a *selected* feature (``s_l``:
:meth:`~rs_interp.features.Transcoder.selected`) adds to its activation in its write into ``l + j``.

An attribution graph with a CLT has the same nodes as with per-layer transcoders (with post-encoder biases: every
selected feature, zeros among a TopK's picks included, since each writes ``c W_dec``); a feature's column holds its
direct effect through every output it writes to, its write into ``m`` being ``(a + c[:, m - l]) W_dec[l][:, m - l]``,
and an error node of layer ``m`` is MLP output ``m`` minus ``y_hat_m``. A skip, within a layer or across layers, is
a linear path of the replacement model, as a same-layer skip is in circuit-tracer's: no node, the graph attributes
through it (a source moving ``x_l`` moves every output ``l`` skips into), and what it carries of the constant
part is in the bias. Everything else (the freezes, the rows, the checks) is the per-layer graph's:
:class:`CrossLayerTranscoder` is a :class:`~rs_interp.features.TranscoderSet` whose layer ``l`` holds the encoder,
``b_dec[l]``, the skip, the post-encoder bias and the decoder into its own layer, and whose
:meth:`~CrossLayerTranscoder.writes_from`, :meth:`~CrossLayerTranscoder.post_biases_from` and
:meth:`~CrossLayerTranscoder.skips_into` add the rest. circuit-tracer's files hold neither term (``save`` refuses).

Files (circuit-tracer's CLT layout): a folder with ``W_enc_{i}.safetensors`` (``W_enc_{i}``
(d_transcoder, d_model), ``b_enc_{i}``, ``b_dec_{i}``, ``threshold_{i}`` for JumpReLU), ``W_dec_{i}.safetensors``
(``W_dec_{i}``, (d_transcoder, n_layers - i, d_model)), optionally ``W_skip_{i}`` in the encoder file, and
``config.yaml`` with ``model_kind: cross_layer_transcoder``, ``feature_input_hook``, ``feature_output_hook``.

>>> clt = CrossLayerTranscoder.random(3, 8, 16, seed=0)
>>> [out for out, _ in clt.writes_from(1)], tuple(clt.decoders[0].shape)
([1, 2], (16, 3, 8))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._backend import Model
from .._files import FileError, check_shape, need, parsing, read_safetensors, read_text
from .._messages import few
from .._progress import bar
from ..exact.needs import MLP_IO, needs
from . import _config
from .transcoders import Transcoder, TranscoderSet

__all__ = ["CrossLayerTranscoder", "load_clt", "train_clt", "TrainedCLT", "shipped_clt", "SHIPPED_CLTS"]

#: The shipped cross-layer transcoders, by model name, under ``rs_interp/toy_models/transcoders/{name}-clt/``.
SHIPPED_CLTS = ("code-2l",)
_SHIPPED_ROOT = Path(__file__).resolve().parents[1] / "toy_models" / "transcoders"


@dataclass(frozen=True)
class CrossLayerTranscoder(TranscoderSet):
    """A cross-layer transcoder (module docstring): per layer a :class:`~rs_interp.features.Transcoder`
    (encoder, ``b_dec``, skip, post-encoder bias; its ``W_dec`` the decoder into its own layer) and ``decoders[l]``
    (d_transcoder, n_layers - l, d_model) into its own layer and every later one; optionally ``skips[l]``
    (n_layers - l, d_model, d_model) and ``post_biases[l]`` (d_transcoder, n_layers - l) (each empty: none; a
    layer's entry None: none from that layer).

    Raises:
        ValueError: decoders, skips or post-encoder biases of the wrong shapes, or a layer's ``W_dec``, ``W_skip``
            or ``post_bias`` that is not ``decoders[l][:, 0]``, ``skips[l][0]`` or ``post_biases[l][:, 0]``.

    >>> clt = CrossLayerTranscoder.random(2, 4, 8)
    >>> len(clt), clt.n_outputs(0), clt.n_outputs(1), clt.config()["model_kind"]
    (2, 2, 1, 'cross_layer_transcoder')
    """

    decoders: tuple[torch.Tensor, ...] = field(default=())
    skips: tuple[torch.Tensor | None, ...] = field(default=())
    post_biases: tuple[torch.Tensor | None, ...] = field(default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        L = len(self.transcoders)
        for name in ("decoders",) + tuple(n for n in ("skips", "post_biases") if getattr(self, n)):
            if len(getattr(self, name)) != L:
                raise ValueError(f"a cross-layer transcoder of {L} layers needs {L} {name}, "
                                 f"got {len(getattr(self, name))}")
        for l, (tc, W) in enumerate(zip(self.transcoders, self.decoders)):
            _check_part(f"decoder {l}", W, (tc.d_transcoder, L - l, tc.d_model), tc.W_dec, W[:, 0],
                        f"W_dec (decoders[{l}][:, 0])")
            if self.skips:
                S = self.skips[l]
                _check_part(f"skips[{l}]", S, (L - l, tc.d_model, tc.d_model), tc.W_skip, S if S is None else S[0],
                            f"W_skip (skips[{l}][0])")
            if self.post_biases:
                c = self.post_biases[l]
                _check_part(f"post_biases[{l}]", c, (tc.d_transcoder, L - l), tc.post_bias, c if c is None else c[:, 0],
                            f"post_bias (post_biases[{l}][:, 0])")

    def n_outputs(self, layer: int) -> int:
        return len(self) - layer

    def writes_from(self, layer: int) -> list[tuple[int, torch.Tensor]]:
        """Every MLP output the features of ``layer`` write to: ``(layer + j, decoders[layer][:, j])``."""
        return [(layer + j, self.decoders[layer][:, j]) for j in range(len(self) - layer)]

    def post_biases_from(self, layer: int) -> list[torch.Tensor | None]:
        """Beside each of :meth:`writes_from`'s writes, the post-encoder bias ``post_biases[layer][:, j]``
        (None: none)."""
        c = self.post_biases[layer] if self.post_biases else None
        return [None if c is None else c[:, j] for j in range(len(self) - layer)]

    def skips_into(self, layer: int) -> list[tuple[int, torch.Tensor]]:
        """Every skip into MLP output ``layer``: its own transcoder's ``W_skip``, then each earlier layer ``l``'s
        ``skips[l][layer - l]``."""
        if not self.skips:
            return TranscoderSet.skips_into(self, layer)
        return [(l, self.skips[l][layer - l]) for l in [layer, *range(layer)] if self.skips[l] is not None]

    def to(self, dtype: torch.dtype) -> "CrossLayerTranscoder":
        tcs = TranscoderSet.to(self, dtype).transcoders
        cast = lambda ts: tuple(None if t is None else t.detach().to(dtype) for t in ts)  # noqa: E731
        return CrossLayerTranscoder(tcs, self.input_point, self.output_point, self.scan, cast(self.decoders),
                                    cast(self.skips), cast(self.post_biases))

    def reconstruct(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every layer's ``y_hat`` from every layer's input ``x_l`` (each (..., d_model)): the module docstring's
        sum."""
        acts = [tc.encode(x) for tc, x in zip(self, inputs)]
        out = [tc.b_dec + self.skip_into(m, inputs) for m, tc in enumerate(self)]
        for l in range(len(self)):
            for (m, W), c in zip(self.writes_from(l), self.post_biases_from(l)):
                out[m] = out[m] + self[l].with_post_bias(acts[l], inputs[l], c) @ W
        return out

    def config(self) -> dict:
        """circuit-tracer's CLT config (:meth:`TranscoderSet.config`).

        Raises:
            ValueError: what :meth:`TranscoderSet.config` refuses; a skip across layers (circuit-tracer's CLT
                files hold a skip within a layer only).
        """
        if any(S is not None and len(S) > 1 and bool(S[1:].ne(0).any()) for S in self.skips):
            raise ValueError("a skip from one layer's input into a later layer's output (skips[l][j], j > 0) has no "
                             "circuit-tracer file: its CLT files hold a skip within a layer only (W_skip_{i})")
        cfg = TranscoderSet.config(self)
        return cfg | {"model_kind": "cross_layer_transcoder"}

    def save(self, folder: str | Path) -> Path:
        """Write circuit-tracer's CLT files (module docstring) into ``folder``."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = self.config()
        for i, tc in enumerate(self):
            enc = {f"W_enc_{i}": tc.W_enc, f"b_enc_{i}": tc.b_enc, f"b_dec_{i}": tc.b_dec}
            if tc.threshold is not None:
                enc[f"threshold_{i}"] = tc.threshold
            if tc.W_skip is not None:
                enc[f"W_skip_{i}"] = tc.W_skip
            for name, tensors in ((f"W_enc_{i}", enc), (f"W_dec_{i}", {f"W_dec_{i}": self.decoders[i]})):
                path = folder / f"{name}.safetensors"
                save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
                path.chmod(0o644)
        (folder / "config.yaml").write_text(_config.dumps(config))
        return folder

    @classmethod
    def from_tensors(cls, W_enc, b_enc, decoders, b_dec, *, activation: str = "relu", k: int | None = None,
                     threshold=None, W_skip=None, input_point: str = "mlp.hook_in", output_point: str = "mlp.hook_out",
                     scan: str = "rs_interp-clt", dtype: torch.dtype = torch.float32, skips=None,
                     post_biases=None) -> "CrossLayerTranscoder":
        """A CLT from per-layer lists: ``W_enc[l]`` (d_transcoder, d_model), ``b_enc[l]``, ``decoders[l]``
        (d_transcoder, n_layers - l, d_model), ``b_dec[l]`` (d_model), ``threshold[l]`` (JumpReLU), ``W_skip[l]``;
        or ``skips[l]`` (n_layers - l, d_model, d_model) into its own and every later layer (``W_skip`` then left
        None); ``post_biases[l]`` (d_transcoder, n_layers - l) (class docstring). An entry None: none."""
        if skips is not None and W_skip is not None:
            raise ValueError("give W_skip (a skip within each layer) or skips (into every later layer too), not both")
        if skips is not None:
            W_skip = [None if S is None else S[0] for S in skips]
        tcs = []
        for l in range(len(W_enc)):
            state = {"W_enc": W_enc[l], "b_enc": b_enc[l], "W_dec": decoders[l][:, 0], "b_dec": b_dec[l]}
            if threshold is not None:
                state["activation_function.threshold"] = threshold[l]
            if W_skip is not None and W_skip[l] is not None:
                state["W_skip"] = W_skip[l]
            if post_biases is not None and post_biases[l] is not None:
                state["post_bias"] = post_biases[l][:, 0]
            tcs.append(Transcoder.from_state({n: t.detach() for n, t in state.items()}, activation=activation, k=k,
                                             dtype=dtype))
        cast = lambda ts: () if ts is None else tuple(None if t is None else t.detach().to(dtype)  # noqa: E731
                                                      for t in ts)
        return cls(tuple(tcs), input_point, output_point, scan, cast(decoders), cast(skips), cast(post_biases))

    @classmethod
    def random(cls, n_layers: int, d_model: int, d_transcoder: int, *, seed: int = 0, activation: str = "relu",
               k: int | None = None, dtype: torch.dtype = torch.float32, scale: float = 0.3) -> "CrossLayerTranscoder":
        """A CLT with every tensor drawn from N(0, scale) (encoder biases shifted down by ``scale``)."""
        g = torch.Generator().manual_seed(seed)
        r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64) * scale  # noqa: E731
        L, d, W = n_layers, d_model, d_transcoder
        return cls.from_tensors([r(W, d) for _ in range(L)], [r(W) - scale for _ in range(L)],
                                [r(W, L - l, d) for l in range(L)], [r(d) for _ in range(L)], activation=activation,
                                k=k, threshold=[r(W).abs() for _ in range(L)] if activation == "jumprelu" else None,
                                dtype=dtype)


def _check_part(name: str, whole: torch.Tensor | None, shape: tuple[int, ...], own: torch.Tensor | None,
                own_part: torch.Tensor | None, what: str) -> None:
    """``whole`` (a layer's decoders, skips or post-encoder biases; None: none) of ``shape``, its part into its own
    layer ``own_part`` equal to the layer transcoder's ``own`` (both None, or both equal)."""
    if whole is not None and tuple(whole.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(whole.shape)}, expected {shape}")
    differ = own is not None and own_part is not None and not torch.equal(own.detach(), own_part.to(own.dtype))
    if (own is None) != (own_part is None) or differ:
        raise ValueError(f"{name}: the layer's {what} is not its part into its own layer")


def load_clt(folder: str | Path, *, dtype: torch.dtype = torch.float32) -> CrossLayerTranscoder:
    """Read circuit-tracer's cross-layer transcoder files from ``folder`` (module docstring).

    Raises:
        rs_interp.FileError: (a ``ValueError``) a file or tensor missing, a file truncated or malformed, a tensor
            of the wrong shape, or a config of another kind; the file named.

    >>> import tempfile
    >>> folder = CrossLayerTranscoder.random(2, 4, 8, activation="jumprelu").save(tempfile.mkdtemp())
    >>> clt = load_clt(folder); clt[0].activation, tuple(clt.decoders[1].shape)
    ('jumprelu', (8, 1, 4))
    """
    folder = Path(folder)
    config = folder / "config.yaml"
    with parsing(config, "CLT config"):
        cfg = _config.loads(read_text(config, "CLT config")) if config.is_file() else {}
    kind = cfg.get("model_kind", "cross_layer_transcoder")
    if kind != "cross_layer_transcoder":
        raise FileError(f"CLT config {config}: model_kind {kind!r}, not a cross-layer transcoder "
                        "(load_transcoders reads per-layer sets).", config)
    n = len(list(folder.glob("W_enc_*.safetensors")))
    if n == 0:
        raise FileError(f"CLT folder {folder} holds no W_enc_{{i}}.safetensors (circuit-tracer's CLT layout).", folder)
    missing = [f for i in range(n) for f in (f"W_enc_{i}.safetensors", f"W_dec_{i}.safetensors")
               if not (folder / f).is_file()]
    if missing:
        raise FileError(f"CLT folder {folder} is missing {few(missing)}.", folder)
    enc, dec = [], []
    for i in range(n):
        e_path, d_path = folder / f"W_enc_{i}.safetensors", folder / f"W_dec_{i}.safetensors"
        enc.append(read_safetensors(e_path, "CLT encoder file"))
        need(enc[i], [f"W_enc_{i}", f"b_enc_{i}", f"b_dec_{i}"], e_path, "CLT encoder file")
        check_shape(enc[i][f"W_enc_{i}"], (enc[i][f"b_enc_{i}"].numel(), enc[i][f"b_dec_{i}"].numel()), f"W_enc_{i}",
                    e_path, "CLT encoder file")
        decoder = read_safetensors(d_path, "CLT decoder file")
        need(decoder, [f"W_dec_{i}"], d_path, "CLT decoder file")  # (d_transcoder, the layers from i on, d_model)
        check_shape(decoder[f"W_dec_{i}"], (*enc[i][f"W_enc_{i}"].shape[:1], n - i, enc[i][f"W_enc_{i}"].shape[1]),
                    f"W_dec_{i}", d_path, "CLT decoder file")
        dec.append(decoder[f"W_dec_{i}"])
    thresholds = [e.get(f"threshold_{i}") for i, e in enumerate(enc)]
    activation = cfg.get("activation", "jumprelu" if all(t is not None for t in thresholds) else "relu")
    activation = {"jump_relu": "jumprelu"}.get(activation, activation)
    with parsing(folder, "CLT folder"):  # a tensor of the wrong shape, a value rs_interp cannot read
        return CrossLayerTranscoder.from_tensors(
            [e[f"W_enc_{i}"] for i, e in enumerate(enc)], [e[f"b_enc_{i}"] for i, e in enumerate(enc)], dec,
            [e[f"b_dec_{i}"] for i, e in enumerate(enc)], activation=activation, k=cfg.get("k"),
            threshold=[t.reshape(-1) for t in thresholds] if activation == "jumprelu" else None,
            W_skip=[e.get(f"W_skip_{i}") for i, e in enumerate(enc)],
            input_point=cfg.get("feature_input_hook", "hook_resid_mid"),
            output_point=cfg.get("feature_output_hook", "hook_mlp_out"), scan=str(cfg.get("scan", folder.name)),
            dtype=dtype)


def shipped_clt(name: str = "code-2l", *, dtype: torch.dtype = torch.float32) -> CrossLayerTranscoder:
    """The cross-layer transcoder shipped for the model ``name`` (trained by ``scripts/train_clt.py``: 1,024
    TopK-16 features a layer; its held-out FVU and curve in ``metrics.json`` beside it).

    >>> clt = shipped_clt("code-2l")
    >>> len(clt), clt[0].d_transcoder, [m for m, _ in clt.writes_from(0)]
    (2, 1024, [0, 1])
    """
    if name not in SHIPPED_CLTS:
        raise ValueError(f"no cross-layer transcoder is shipped for {name!r}; shipped: {SHIPPED_CLTS}")
    return load_clt(_SHIPPED_ROOT / f"{name}-clt", dtype=dtype)


@dataclass(frozen=True)
class TrainedCLT:
    """A trained CLT, its per-layer FVU on held-out tokens and its training curve (mean FVU every ``steps // 100``
    steps).

    >>> TrainedCLT(CrossLayerTranscoder.random(1, 4, 8), (0.5,), (1.0, 0.5)).fvu
    (0.5,)
    """

    clt: CrossLayerTranscoder
    fvu: tuple[float, ...]
    curve: tuple[float, ...]


@needs(*MLP_IO, name="features.train_clt", refuses=("attention-only",))
def train_clt(model: Model, tokens: torch.Tensor, *, d_transcoder: int = 512, activation: str = "topk", k: int = 16,
              l1: float = 1e-3, steps: int = 2000, batch_size: int = 1024, lr: float = 1e-3, seed: int = 0,
              input_point: str = "mlp.hook_in", eval_tokens: torch.Tensor | None = None,
              progress: bool = True) -> TrainedCLT:
    """Fit a cross-layer transcoder to ``model``'s MLPs on ``tokens`` (batch, pos): Adam on

        sum_m ||y_m - y_hat_m||^2 / var(y_m)  +  l1 * sum_{l, i} a_{l,i} ||W_dec[l][i]||

    (ReLU; TopK: the first term only), every layer's MLP input and output collected over every token
    (:mod:`.training`'s pairs);
    ``progress``: a progress bar over the steps (as :func:`~rs_interp.features.train_transcoder`).

    Raises:
        ValueError: what :func:`~rs_interp.features.train_transcoder` refuses (an attention-only model ...).

    >>> from rs_interp import load_toy_model
    >>> t = train_clt(load_toy_model("code-2l"), torch.randint(0, 2048, (4, 32)), d_transcoder=32, k=4, steps=5,
    ...               batch_size=64)
    >>> len(t.clt), len(t.fvu)
    (2, 2)
    """
    from ..exact.certificate import require
    from .training import Recipe, _pairs

    require(model, "features.train_clt")
    cfg = model.cfg
    recipe = Recipe(d_transcoder, activation, k, l1, steps, batch_size, lr, seed)
    like = TranscoderSet(tuple(Transcoder(cfg.d_model, 1) for _ in range(cfg.n_layers)), input_point)
    with torch.no_grad():
        xs, ys = _pairs(model, like, torch.as_tensor(tokens))
    g = torch.Generator().manual_seed(seed)  # the initialisation's draws, then the batches'
    weights = _clt_init(ys, d_transcoder, g)
    curve = _fit_clt(xs, ys, weights, g, recipe, progress)
    clt = CrossLayerTranscoder.from_tensors(*weights, activation=activation, k=k if activation == "topk" else None,
                                           input_point=input_point, scan=f"{getattr(cfg, 'model_name', 'model')}-clt")
    ex, ey = (xs, ys) if eval_tokens is None else _pairs(model, like, torch.as_tensor(eval_tokens))
    dt = torch.float32
    with torch.no_grad():
        recon = clt.reconstruct([x.to(dt) for x in ex])
        fvu = tuple(float(((ey[m].to(dt) - recon[m]) ** 2).sum(-1).mean() / ey[m].to(dt).var(0).sum().clamp(min=1e-12))
                    for m in range(len(ey)))
    return TrainedCLT(clt, fvu, tuple(curve))


def _clt_init(ys: list[torch.Tensor], d_transcoder: int, g: torch.Generator) -> tuple[list[torch.nn.Parameter], ...]:
    """The CLT's parameters before training: Gaussian encoders and decoders drawn from ``g`` (encoders first),
    zero encoder biases, each decoder bias its layer's mean output; (W_enc, b_enc, W_dec, b_dec), float32."""
    L, d, dt = len(ys), ys[0].shape[-1], torch.float32
    W_enc = [torch.nn.Parameter(torch.randn(d_transcoder, d, generator=g) / math.sqrt(d)) for _ in range(L)]
    b_enc = [torch.nn.Parameter(torch.zeros(d_transcoder)) for _ in range(L)]
    W_dec = [torch.nn.Parameter(torch.randn(d_transcoder, L - l, d, generator=g) / math.sqrt(d_transcoder * (L - l)))
             for l in range(L)]
    b_dec = [torch.nn.Parameter(ys[m].mean(0).to(dt).clone()) for m in range(L)]
    return W_enc, b_enc, W_dec, b_dec


def _clt_forward(weights, batch_x: list[torch.Tensor], activation: str, k: int | None):
    """Every layer's activations and every layer's reconstructed MLP output (the sum of the writes into it)."""
    W_enc, b_enc, W_dec, b_dec = weights
    L = len(W_enc)

    def act(pre):
        if activation == "relu":
            return torch.relu(pre)
        kept = pre.topk(k, dim=-1).indices
        return torch.zeros_like(pre).scatter(-1, kept, pre.gather(-1, kept))

    acts = [act(x @ W_enc[l].T + b_enc[l]) for l, x in enumerate(batch_x)]
    out = [b_dec[m].expand(len(batch_x[0]), -1) for m in range(L)]
    for l in range(L):
        for j in range(L - l):
            out[l + j] = out[l + j] + acts[l] @ W_dec[l][:, j]
    return acts, out


def _fit_clt(xs, ys, weights, g: torch.Generator, r, progress: bool) -> list[float]:
    """Adam on the CLT's parameters (``weights``, trained in place) over batches drawn from ``g``; the curve."""
    L, n, dt = len(xs), len(xs[0]), torch.float32
    W_dec = weights[2]
    opt = torch.optim.Adam([p for group in weights for p in group], lr=r.lr)
    var = [y.var(0).sum().clamp(min=1e-12) for y in ys]
    curve = []
    with torch.enable_grad():
        for step in bar(range(r.steps), desc="cross-layer transcoder", enabled=progress, unit="step"):
            idx = torch.randint(0, n, (min(r.batch_size, n),), generator=g)
            acts, out = _clt_forward(weights, [x[idx].to(dt) for x in xs], r.activation, r.k)
            fvu = [((ys[m][idx].to(dt) - out[m]) ** 2).sum(-1).mean() / var[m] for m in range(L)]
            loss = sum(fvu)
            if r.activation == "relu":
                loss = loss + r.l1 * sum((acts[l] * W_dec[l].norm(dim=(1, 2))).sum(-1).mean() for l in range(L))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % max(1, r.steps // 100) == 0:
                curve.append(float(sum(f.detach() for f in fvu)) / L)
    return curve
