"""Per-layer transcoders: a sparse, wide replacement of each MLP, in circuit-tracer's file format.

A transcoder of layer ``l`` reads the MLP's input ``x`` and writes an approximation of its output:

    f = act(x W_enc^T + b_enc)            (d_transcoder,)  the feature activations
    y = f W_dec + b_dec (+ x W_skip^T)    (d_model,)       the reconstruction

with ``act`` ReLU, JumpReLU (``pre * (pre > threshold)``), TopK (circuit-tracer's: the ``k`` largest pre-activations
kept, negative ones too, the rest 0) or ReLU-TopK (EleutherAI sparsify's ``"topk"``: the ``k`` largest of ``relu(pre)``,
so a pre-activation <= 0 is never active; where fewer than ``k`` are positive the two differ). ``W_enc`` and ``W_dec``
are (d_transcoder, d_model) (circuit-tracer's layout): row ``i`` of each is feature ``i``'s input and output direction.

A **post-encoder bias** ``c`` (sparsify's ``post_enc``; none by default): ``y = (f + c s) W_dec + b_dec (+ ...)``, ``s``
1 on the features selected (:meth:`Transcoder.selected`; TopK: the ``k`` picked by ``torch.topk``, zeros among them
where fewer than ``k`` are positive). No circuit-tracer file holds it.

Files (circuit-tracer's per-layer transcoder set): a folder with ``layer_{i}.safetensors`` (``W_enc``, ``W_dec``,
``b_enc``, ``b_dec``, optional ``W_skip``, ``activation_function.threshold`` for JumpReLU, ``k`` for TopK) and a
``config.yaml`` (``model_kind: transcoder_set``, ``feature_input_hook``, ``feature_output_hook``, ``activation``, ``k``,
``scan``). :func:`load_transcoders` reads such a folder, :meth:`TranscoderSet.save` writes one.

Where a transcoder reads and writes (:data:`INPUT_POINTS`, :data:`OUTPUT_POINTS`): the MLP's own input (``mlp.hook_in``,
after the second norm, circuit-tracer's name) or the stream before the norm (``hook_resid_mid``) or TransformerLens's
``ln2.hook_normalized`` (the norm before its gain); and the MLP's output (``mlp.hook_out`` = ``hook_mlp_out``). All are
linear in the residual stream once the norm's scale is frozen, which is what the attribution graph needs.

>>> import torch
>>> tc = Transcoder(4, 8, activation="topk", k=2); _ = torch.nn.init.normal_(tc.W_enc)
>>> (tc.encode(torch.randn(3, 4)) != 0).sum(-1).tolist()
[2, 2, 2]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from jaxtyping import Bool, Float

from .. import _names as N
from .._files import FileError, parsing, read_json, read_safetensors, read_text
from .._messages import few
from ..exact.certificate import require
from ..exact.needs import MLP_IO, needs
from . import _config

__all__ = ["Transcoder", "TranscoderSet", "load_transcoders", "mlp_transcoders", "shipped_transcoders",
           "SHIPPED_TRANSCODERS", "INPUT_POINTS", "OUTPUT_POINTS"]

#: Where a transcoder may read (the MLP's input after the norm, the stream before it, TransformerLens's normalized
#: stream before the gain) and write (OUTPUT_POINTS: the MLP's output, both names one point), circuit-tracer's names.
INPUT_POINTS = N.TRANSCODER_INPUTS
OUTPUT_POINTS = N.TRANSCODER_OUTPUTS
ACTIVATIONS = ("relu", "jumprelu", "topk", "relu_topk")
#: The activations that keep the ``k`` largest (and so take a ``k``).
TOPK_ACTIVATIONS = ("topk", "relu_topk")
#: The activations circuit-tracer's files hold (its ``TopK`` keeps negative pre-activations: no ``relu_topk``).
CIRCUIT_TRACER_ACTIVATIONS = ("relu", "jumprelu", "topk")

#: The shipped transcoder sets, by model name, under ``rs_interp/toy_models/transcoders/``.
SHIPPED_TRANSCODERS = ("code-2l",)
_SHIPPED_ROOT = Path(__file__).resolve().parents[1] / "toy_models" / "transcoders"


class Transcoder(torch.nn.Module):
    """One layer's transcoder (module docstring for the formula).

    Args:
        d_model: width of the stream it reads and writes.
        d_transcoder: number of features.
        activation: ``"relu"``, ``"jumprelu"`` (with per-feature ``threshold``), ``"topk"`` or ``"relu_topk"``
            (with ``k``; module docstring).
        k: TopK's number of features kept per token.
        skip: whether it has a linear skip connection ``W_skip`` (d_model, d_model).
        post_bias: whether it has a post-encoder bias ``post_bias`` (d_transcoder,) (module docstring).

    Raises:
        ValueError: an unknown activation, or TopK without a ``k`` in ``[1, d_transcoder]``.

    >>> tc = Transcoder(4, 8, activation="jumprelu", skip=True)
    >>> tc.d_model, tc.d_transcoder, tuple(tc.threshold.shape), tuple(tc.W_skip.shape)
    (4, 8, (8,), (4, 4))
    """

    def __init__(self, d_model: int, d_transcoder: int, *, activation: str = "relu", k: int | None = None,
                 skip: bool = False, dtype: torch.dtype = torch.float32, post_bias: bool = False) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if activation in TOPK_ACTIVATIONS and (k is None or not 1 <= int(k) <= d_transcoder):
            raise ValueError(f"a TopK transcoder needs k in [1, {d_transcoder}], got {k!r}")
        self.activation, self.k = activation, (int(k) if activation in TOPK_ACTIVATIONS else None)
        z = lambda *shape: torch.nn.Parameter(torch.zeros(*shape, dtype=dtype))  # noqa: E731
        self.W_enc, self.b_enc = z(d_transcoder, d_model), z(d_transcoder)
        self.W_dec, self.b_dec = z(d_transcoder, d_model), z(d_model)
        self.threshold = z(d_transcoder) if activation == "jumprelu" else None
        self.W_skip = z(d_model, d_model) if skip else None
        self.post_bias = z(d_transcoder) if post_bias else None

    @property
    def d_model(self) -> int:
        return self.W_enc.shape[1]

    @property
    def d_transcoder(self) -> int:
        return self.W_enc.shape[0]

    def pre_activation(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_transcoder"]:
        """``x W_enc^T + b_enc``: what the activation function reads (the quantity a graph attributes)."""
        return x @ self.W_enc.T + self.b_enc

    def activate(self, pre: Float[torch.Tensor, "... d_transcoder"]) -> Float[torch.Tensor, "... d_transcoder"]:
        """The activation function applied to pre-activations."""
        if self.activation == "relu":
            return torch.relu(pre)
        if self.activation == "jumprelu":
            return pre * (pre > self.threshold)
        kept = pre.topk(self.k, dim=-1).indices
        top = torch.zeros_like(pre).scatter(-1, kept, pre.gather(-1, kept))
        # relu(topk(pre)) is topk(relu(pre)): the k largest of relu(pre) are the k largest of pre, clipped at 0
        return torch.relu(top) if self.activation == "relu_topk" else top

    def encode(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_transcoder"]:
        """The feature activations."""
        return self.activate(self.pre_activation(x))

    def selected(self, x: Float[torch.Tensor, "... d_model"]) -> Bool[torch.Tensor, "... d_transcoder"]:
        """The features a post-encoder bias is added to: ``pre > 0`` (ReLU), ``pre > threshold`` (JumpReLU), the ``k``
        chosen (ReLU-TopK: sparsify's own ``torch.topk(relu(pre), k, sorted=False)``, its picks among zeros too)."""
        pre = self.pre_activation(x)
        if self.activation == "relu":
            return pre > 0
        if self.activation == "jumprelu":
            return pre > self.threshold
        kept = (torch.relu(pre) if self.activation == "relu_topk" else pre).topk(self.k, dim=-1, sorted=False).indices
        return torch.zeros_like(pre, dtype=torch.bool).scatter(-1, kept, True)

    def with_post_bias(self, acts: Float[torch.Tensor, "... d_transcoder"], x: torch.Tensor | None,
                       post_bias: torch.Tensor | None) -> Float[torch.Tensor, "... d_transcoder"]:
        """What a decoder reads: ``acts`` (of the input ``x``) plus ``post_bias`` (or none) on the selected features."""
        if post_bias is not None and x is None:
            raise ValueError("this transcoder has a post-encoder bias: decode needs the input x (what is selected)")
        return acts if post_bias is None else acts + self.selected(x).to(acts.dtype) * post_bias

    def skip(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_model"] | float:
        """The skip connection's write ``x W_skip^T`` (0 without one)."""
        return 0.0 if self.W_skip is None else x @ self.W_skip.T

    def decode(self, acts: Float[torch.Tensor, "... d_transcoder"],
               x: Float[torch.Tensor, "... d_model"] | None = None) -> Float[torch.Tensor, "... d_model"]:
        """The reconstruction from activations (and, with a skip connection, the input ``x``)."""
        if self.W_skip is not None and x is None:
            raise ValueError("this transcoder has a skip connection: decode needs the input x too")
        skip = self.skip(x) if x is not None else 0.0
        return self.with_post_bias(acts, x, self.post_bias) @ self.W_dec + self.b_dec + skip

    def forward(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_model"]:
        return self.decode(self.encode(x), x)

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors of ``layer_{i}.safetensors``, named as circuit-tracer names them."""
        out = {n: getattr(self, n).detach().contiguous() for n in ("W_enc", "W_dec", "b_enc", "b_dec")}
        if self.threshold is not None:
            out["activation_function.threshold"] = self.threshold.detach().contiguous()
        if self.k is not None:
            out["k"] = torch.tensor(self.k)
        if self.W_skip is not None:
            out["W_skip"] = self.W_skip.detach().contiguous()
        if self.post_bias is not None:  # rs_interp's name: no circuit-tracer file holds it (config refuses)
            out["post_bias"] = self.post_bias.detach().contiguous()
        return out

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], *, activation: str | None = None, k: int | None = None,
                   dtype: torch.dtype = torch.float32) -> "Transcoder":
        """A transcoder from :meth:`state`'s tensors; the activation as circuit-tracer infers it when not
        given: TopK if the file holds ``k``, JumpReLU if it holds a threshold, else ReLU.

        Raises:
            ValueError: a tensor missing or of the wrong shape.
        """
        missing = {"W_enc", "W_dec", "b_enc", "b_dec"} - set(state)
        if missing:
            raise ValueError(f"transcoder file lacks {few(sorted(missing))}")
        if state["W_enc"].ndim != 2:
            raise ValueError(f"W_enc must be (d_transcoder, d_model), got shape {tuple(state['W_enc'].shape)}")
        if activation is None:
            activation = "topk" if "k" in state else "jumprelu" if "activation_function.threshold" in state else "relu"
        if activation in TOPK_ACTIVATIONS and k is None:
            k = int(state["k"]) if "k" in state else None
        d_transcoder, d_model = state["W_enc"].shape
        tc = cls(d_model, d_transcoder, activation=activation, k=k, skip="W_skip" in state, dtype=dtype,
                 post_bias="post_bias" in state)
        names = {"activation_function.threshold": "threshold"}
        with torch.no_grad():
            for key, value in state.items():
                if key == "k":
                    continue
                param = getattr(tc, names.get(key, key), None)
                if param is None:
                    raise ValueError(f"unexpected tensor {key!r} for a {activation} transcoder")
                if tuple(param.shape) != tuple(value.shape):
                    raise ValueError(f"{key}: shape {tuple(value.shape)}, expected {tuple(param.shape)}")
                param.copy_(value.to(dtype))
        return tc


@dataclass(frozen=True)
class TranscoderSet:
    """One transcoder per layer, and where they read and write.

    Attributes:
        transcoders: layer ``l``'s transcoder at index ``l``.
        input_point: one of :data:`INPUT_POINTS` (default the MLP's input).
        output_point: one of :data:`OUTPUT_POINTS`.
        scan: circuit-tracer's identifier of the set (its graph JSON's ``metadata.scan``).

    >>> tcs = TranscoderSet((Transcoder(4, 8), Transcoder(4, 8)))
    >>> len(tcs), tcs.config()["activation"], tcs.to(torch.float64).dtype
    (2, 'relu', torch.float64)
    """

    transcoders: tuple[Transcoder, ...]
    input_point: str = N.MLP_HOOK_IN
    output_point: str = N.MLP_HOOK_OUT
    scan: str = "rs_interp"

    def __post_init__(self) -> None:
        if not self.transcoders:
            raise ValueError("a transcoder set needs at least one transcoder")
        if self.input_point not in INPUT_POINTS:
            raise ValueError(f"input_point must be one of {INPUT_POINTS}, got {self.input_point!r}")
        if self.output_point not in OUTPUT_POINTS:
            raise ValueError(f"output_point must be one of {OUTPUT_POINTS}, got {self.output_point!r}")
        if len({tc.d_model for tc in self.transcoders}) != 1:
            raise ValueError("the transcoders read streams of different widths")

    def __len__(self) -> int:
        return len(self.transcoders)

    def __getitem__(self, layer: int) -> Transcoder:
        return self.transcoders[layer]

    def __iter__(self) -> Iterator[Transcoder]:
        return iter(self.transcoders)

    @property
    def dtype(self) -> torch.dtype:
        return self.transcoders[0].W_enc.dtype

    def writes_from(self, layer: int) -> list[tuple[int, torch.Tensor]]:
        """Where the features of ``layer`` write: ``(output layer, decoder (d_transcoder, d_model))`` each.
        A per-layer set: its own MLP's output only (a cross-layer transcoder: every later one too)."""
        return [(layer, self.transcoders[layer].W_dec)]

    def post_biases_from(self, layer: int) -> list[torch.Tensor | None]:
        """Beside each of :meth:`writes_from`'s writes, the post-encoder bias ``c`` of its ``(a + c s) W`` (or None)."""
        return [self.transcoders[layer].post_bias]

    def skips_into(self, layer: int) -> list[tuple[int, torch.Tensor]]:
        """The linear skips into MLP output ``layer``: ``(source layer, W (d_model, d_model))``, each writing
        ``x_source W^T``. A per-layer set: its own transcoder's ``W_skip`` (a cross-layer one: earlier layers' too)."""
        return [] if self.transcoders[layer].W_skip is None else [(layer, self.transcoders[layer].W_skip)]

    def skip_into(self, layer: int, inputs) -> torch.Tensor | float:
        """The skips' write into MLP output ``layer`` from the transcoder inputs ``inputs[l]`` (a list or mapping
        holding each source layer's, (..., d_model)): ``sum_l x_l W^T`` over :meth:`skips_into` (0 without one)."""
        return sum((inputs[src] @ W.T for src, W in self.skips_into(layer)), 0.0)

    def to(self, dtype: torch.dtype) -> "TranscoderSet":
        """A copy in ``dtype`` (e.g. float64 for the exact checks)."""
        tcs = tuple(Transcoder.from_state(tc.state(), activation=tc.activation, k=tc.k, dtype=dtype) for tc in self)
        return TranscoderSet(tcs, self.input_point, self.output_point, self.scan)

    def config(self) -> dict:
        """circuit-tracer's ``config.yaml`` of the set.

        Raises:
            ValueError: layers of different activations or ``k``; an activation circuit-tracer has not
                (``relu_topk``, sparsify's: circuit-tracer's TopK would keep the negative pre-activations); a
                post-encoder bias (circuit-tracer's transcoders write ``a W_dec``).
        """
        kinds = {tc.activation for tc in self}
        if any(tc.post_bias is not None for tc in self):
            raise ValueError("a post-encoder bias (sparsify's post_enc: (a + c) W_dec on the selected features) has no "
                             "circuit-tracer file: its transcoders write a W_dec")
        if len(kinds) != 1 or len({tc.k for tc in self}) != 1:
            raise ValueError("circuit-tracer's config holds one activation (and one k) for every layer")
        if not kinds <= set(CIRCUIT_TRACER_ACTIVATIONS):
            raise ValueError(f"activation {sorted(kinds)[0]!r} (EleutherAI sparsify's TopK, the k largest of "
                             "relu(pre)) has no circuit-tracer file: its TopK keeps the k largest pre-activations, "
                             "negative ones too, so such a file would be another transcoder where fewer than k are "
                             "positive")
        cfg = {"model_kind": "transcoder_set", "scan": self.scan, "feature_input_hook": self.input_point,
               "feature_output_hook": self.output_point, "activation": kinds.pop()}
        if self.transcoders[0].k is not None:
            cfg["k"] = self.transcoders[0].k
        return cfg

    def save(self, folder: str | Path) -> Path:
        """Write ``layer_{i}.safetensors`` and ``config.yaml`` into ``folder`` (made if needed), as circuit-tracer's
        ``load_transcoders`` reads them: a TopK set's ``k`` in the config only (its loader refuses a ``k`` tensor)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = self.config()  # refuses a mixed set before anything is written
        for i, tc in enumerate(self):
            path = folder / f"layer_{i}.safetensors"
            # k lives in config.yaml: circuit-tracer's load_transcoder refuses a "k" tensor in a layer file
            save_file({k: v.cpu() for k, v in tc.state().items() if k != "k"}, str(path))
            path.chmod(0o644)  # safetensors writes owner-only files; these are data to ship and share
        (folder / "config.yaml").write_text(_config.dumps(config))
        return folder


def load_transcoders(folder: str | Path, *, dtype: torch.dtype = torch.float32) -> TranscoderSet:
    """Read a circuit-tracer transcoder set from ``folder`` (``config.yaml`` and ``layer_{i}.safetensors``;
    or the files the config's ``transcoders`` list names, relative to the folder).

    Raises:
        rs_interp.FileError: (a ``ValueError``) no config, a config that is not a per-layer set or that rs_interp
            cannot read, a layer file missing, truncated or malformed (a tensor missing or of the wrong shape),
            an input or output point rs_interp cannot read; the file named.
        ValueError: a ``hf://`` path (nothing is downloaded here).

    >>> import tempfile
    >>> folder = TranscoderSet((Transcoder(4, 8, activation="topk", k=2),)).save(tempfile.mkdtemp())
    >>> sorted(p.name for p in folder.iterdir()), load_transcoders(folder)[0].k
    (['config.yaml', 'layer_0.safetensors'], 2)
    """
    folder = Path(folder)
    config = folder / "config.yaml"
    if not config.is_file():
        raise FileError(f"transcoder folder {folder} has no config.yaml (circuit-tracer's transcoder-set config).",
                        config)
    with parsing(config, "transcoder config"):
        cfg = _config.loads(read_text(config, "transcoder config"))
        paths = [str(p) for p in cfg["transcoders"]] if "transcoders" in cfg else None
    if cfg.get("model_kind", "transcoder_set") != "transcoder_set":
        raise FileError(f"transcoder config {config}: model_kind {cfg.get('model_kind')!r}; load_transcoders reads "
                        "per-layer sets (cross-layer transcoders: rs_interp.features.load_clt).", config)
    if paths is None:  # layer_0 ... layer_{n-1}: a gap in the numbers is a file missing, not a shorter set
        found = [m.group(1) for f in folder.glob("layer_*.safetensors")
                 if (m := re.fullmatch(r"layer_(\d+)\.safetensors", f.name))]
        paths = [f"layer_{i}.safetensors" for i in range(max(map(int, found), default=-1) + 1)]
    if not paths:
        raise FileError(f"transcoder folder {folder} holds no layer_{{i}}.safetensors.", folder)
    if any(p.startswith("hf://") for p in paths):
        raise ValueError("the config names hf:// files: download them first (rs_interp reads local files only)")
    files = [folder / p for p in paths]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FileError(f"transcoder folder {folder} is missing {few(missing)} (its layer files).", folder)
    tcs = []
    for f in files:
        state = read_safetensors(f, "transcoder file")
        with parsing(f, "transcoder file"):
            tcs.append(Transcoder.from_state(state, activation=cfg.get("activation"), k=cfg.get("k"), dtype=dtype))
    with parsing(config, "transcoder config"):  # its points, and layers of one width
        return TranscoderSet(tuple(tcs), cfg.get("feature_input_hook", N.MLP_HOOK_IN),
                             cfg.get("feature_output_hook", N.MLP_HOOK_OUT), str(cfg.get("scan", folder.name)))


def shipped_transcoders(name: str = "code-2l", *, dtype: torch.dtype = torch.float32) -> TranscoderSet:
    """The transcoder set shipped for the model ``name`` (trained by ``scripts/train_transcoders.py``;
    its metrics in ``metrics.json`` beside it, see :func:`shipped_metrics`).

    >>> tcs = shipped_transcoders("code-2l")
    >>> len(tcs), tcs[0].d_model, tcs.input_point
    (2, 128, 'mlp.hook_in')
    """
    if name not in SHIPPED_TRANSCODERS:
        raise ValueError(f"no transcoders are shipped for {name!r}; shipped: {SHIPPED_TRANSCODERS}")
    return load_transcoders(_SHIPPED_ROOT / name, dtype=dtype)


def shipped_metrics(name: str = "code-2l") -> dict:
    """The metrics recorded when the shipped set ``name`` was trained (``metrics.json``): the settings,
    the measures of :func:`~rs_interp.features.transcoder_metrics` on held-out windows, the curves.

    >>> m = shipped_metrics("code-2l")
    >>> m["settings"]["activation"], len(m["metrics"]["fvu"])
    ('topk', 2)
    """
    if name not in SHIPPED_TRANSCODERS:
        raise ValueError(f"no transcoders are shipped for {name!r}; shipped: {SHIPPED_TRANSCODERS}")
    return read_json(_SHIPPED_ROOT / name / "metrics.json", "transcoder metrics")


@needs(*MLP_IO, "mlp weights", name="features.mlp_transcoders",
       refuses=("attention-only", "not plain ReLU MLPs", "post-norm blocks"))
def mlp_transcoders(model) -> TranscoderSet:
    """The exact transcoders of a ReLU MLP: each neuron a feature (``W_enc = W_in^T``, ``b_enc = b_in``,
    ``W_dec = W_out``, ``b_dec = b_out``), so the reconstruction *is* the MLP: every error node is 0
    and a graph's replacement and completeness scores are 1 (the ground truth of feature circuits;
    tracr's MLPs are such MLPs).

    Raises:
        ValueError: the model has no MLPs, or its MLPs are not plain ReLU MLPs (gated, or another activation).

    >>> from rs_interp import load_toy_model
    >>> tcs = mlp_transcoders(load_toy_model("tracr-sort"))
    >>> len(tcs), tcs[0].d_transcoder
    (3, 20)
    """
    cfg = model.cfg
    require(model, "features.mlp_transcoders")
    out = []
    for l in range(cfg.n_layers):
        mlp = model.blocks[l].mlp
        W_in, b_in, W_out, b_out = (t.detach() for t in (mlp.W_in, mlp.b_in, mlp.W_out, mlp.b_out))
        tc = Transcoder(W_in.shape[0], W_in.shape[1], dtype=W_in.dtype)
        with torch.no_grad():
            tc.W_enc.copy_(W_in.T), tc.b_enc.copy_(b_in), tc.W_dec.copy_(W_out), tc.b_dec.copy_(b_out)
        out.append(tc)
    return TranscoderSet(tuple(out), scan=f"{getattr(cfg, 'model_name', 'model')}-mlp-neurons")
