"""Models compiled from RASP programs by tracr, and their ground-truth circuits (issue 31).

tracr (Lindner et al. 2023) compiles a RASP program into transformer weights whose residual stream
has one labelled basis direction per value of every intermediate variable (``"tokens:3"``,
``"indices:0"``, ``"one"``, ``"reverse_1:2"`` ...). Which component writes and which reads each
direction is therefore known exactly, and with it the model's edges. ``scripts/compile_tracr.py``
(run by hand, in a venv with tracr and JAX) compiles the programs and ships them as ordinary
rs_interp checkpoints; this module reads them without JAX.

The models: no LayerNorm, ReLU MLPs, learned one-hot positions (position 0 is the BOS and has no
position embedding), bidirectional attention, no unembedding bias. Each input starts with the BOS
token; the output at the BOS position means nothing and is dropped.

The edge layout is :mod:`rs_interp.circuits.graph`'s (issue 30): senders ``embed`` (token *and* position embedding, one
sender: what enters ``blocks.0.hook_resid_pre``), every head ``L{l}H{h}`` and every MLP ``MLP{l}``; receivers every
head's query, key and value input ``L{l}H{h}.q`` / ``.k`` / ``.v``, every MLP ``MLP{l}`` and ``logits``. The edge
``(sender, receiver)`` exists iff the sender comes strictly before the receiver and the residual directions it writes
(nonzero rows of its output map, in the residual basis) meet those the receiver reads (nonzero columns of its input
map). Every bias of a compiled model is zero (tracr routes constants through the ``"one"`` direction), so the weights
say it all. The metadata also keeps the embedding's two parts (``writes["embed.tokens"]``, ``writes["embed.pos"]``) for
a layout that splits them.

>>> TRACR_PROGRAMS[:2]
('tracr-reverse', 'tracr-sort')
>>> reference("reverse", [1, 2, 3])
[3, 2, 1]
>>> model = load_tracr_model("tracr-reverse")
>>> run_program(model, [[1, 2, 3], [3, 3, 1, 2, 2]])
[[3, 2, 1], [2, 2, 1, 3, 3]]
>>> ("L3H0", "logits") in ground_truth_edges("tracr-reverse")
True
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal, Mapping, Sequence

import torch
from jaxtyping import Float, Int

from .._backend import Model
from .._files import parsing, read_json
from .._messages import few
from ..models import checkpoints as _models
from ..models.registry import load_toy_model, toy_model_path
from .graph import depth, edge_layout  # noqa: F401  (depth: the docstring example)

__all__ = [
    "TRACR_PROGRAMS",
    "PROGRAMS",
    "ProgramSpec",
    "TracrMetadata",
    "metadata",
    "load_tracr_model",
    "encode",
    "decode",
    "run_program",
    "program_of",
    "reference",
    "ground_truth_edges",
    "depth",
    "component_weights",
]

Value = Any  # a token or output value: int, str, bool or float


# --- the programs, in plain Python -----------------------------------------------------------------

def _reverse(xs: Sequence[Value]) -> list[Value]:
    return list(xs)[::-1]


def _sort(xs: Sequence[Value]) -> list[Value]:
    return sorted(xs)


def _hist(xs: Sequence[Value]) -> list[Value]:
    return [list(xs).count(x) for x in xs]


def _frac_prevs(xs: Sequence[Value]) -> list[Value]:
    hits = [x == "x" for x in xs]
    return [sum(hits[: i + 1]) / (i + 1) for i in range(len(xs))]


def _at_least_half(xs: Sequence[Value]) -> list[Value]:
    return [1.0 if 2 * sum(x == "x" for x in xs[: i + 1]) >= i + 1 else 0.0 for i in range(len(xs))]


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    """What a compiled program computes and on which inputs.

    Attributes:
        name: the program's name (the toy model is ``"tracr-" + name``).
        description: one line, the RASP program in words.
        vocab: the input tokens (without BOS and PAD).
        max_seq_len: the longest input (without BOS); the model's ``n_ctx`` is one more.
        output: ``"categorical"`` (argmax over the output values) or ``"numerical"`` (one number
            per position, read from a single residual direction).
        reference: the program in plain Python, one input sequence to one output sequence.
    """

    name: str
    description: str
    vocab: tuple[Value, ...]
    max_seq_len: int
    output: Literal["categorical", "numerical"]
    reference: Callable[[Sequence[Value]], list[Value]]


#: The compiled programs. ``scripts/compile_tracr.py`` builds each from tracr's RASP library with
#: these vocabularies and lengths; the checkpoints record what was compiled.
PROGRAMS: Mapping[str, ProgramSpec] = {
    s.name: s
    for s in (
        ProgramSpec("reverse", "tracr lib make_reverse: length by SelectorWidth, opp_idx = length - indices - 1 "
                    "(categorical MLPs), Aggregate(Select(indices, opp_idx, EQ), tokens)",
                    (1, 2, 3), 5, "categorical", _reverse),
        ProgramSpec("sort", "tracr lib make_sort(tokens, tokens, min_key=1): keys made unique by "
                    "x + i / max_seq_len (categorical MLP), target position by SelectorWidth(LT), Aggregate",
                    (1, 2, 3, 4), 5, "categorical", _sort),
        ProgramSpec("hist", "tracr lib make_hist: SelectorWidth(Select(tokens, tokens, EQ)), the count of "
                    "each token in the input", ("a", "b", "c"), 5, "categorical", _hist),
        ProgramSpec("frac_prevs", "tracr lib make_frac_prevs(tokens == 'x'): the fraction of 'x' up to each "
                    "position (categorical-to-numerical MLP, numerical mean Aggregate)",
                    ("x", "y", "z"), 5, "numerical", _frac_prevs),
        ProgramSpec("at_least_half", "numerical Map(f >= 1/2 -> 1 else 0) on frac_prevs(tokens == 'x'): "
                    "whether at least half the tokens so far are 'x' (a discretising numerical MLP on top of "
                    "an attention mean)", ("x", "y"), 5, "numerical", _at_least_half),
    )
}

#: The shipped toy-model names, one per program (``load_toy_model(name)`` loads them).
TRACR_PROGRAMS: tuple[str, ...] = tuple(f"tracr-{p}" for p in PROGRAMS)


def _program(name: str) -> str:
    """``"reverse"`` from ``"reverse"`` or ``"tracr-reverse"``."""
    program = name.removeprefix("tracr-") if isinstance(name, str) else name
    if program not in PROGRAMS:
        raise ValueError(f"name must be one of {list(TRACR_PROGRAMS)} (or without the 'tracr-' prefix), got {name!r}")
    return program


def reference(name: str, inputs: Sequence[Value]) -> list[Value]:
    """The program ``name`` on one input sequence, in plain Python (no model, no BOS).

    >>> reference("sort", [3, 1, 3, 2])
    [1, 2, 3, 3]
    >>> reference("hist", ["a", "b", "a"])
    [2, 1, 2]
    >>> reference("frac_prevs", ["x", "y", "x", "z"])
    [1.0, 0.5, 0.6666666666666666, 0.5]
    >>> reference("at_least_half", ["x", "y", "y", "x", "x"])
    [1.0, 1.0, 0.0, 1.0, 1.0]
    """
    return PROGRAMS[_program(name)].reference(inputs)


# --- the metadata a checkpoint carries --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TracrMetadata:
    """What ``scripts/compile_tracr.py`` stored beside a compiled model.

    Attributes:
        name: the program (``"reverse"``).
        description: the RASP program in words.
        vocab: the input tokens, without BOS and PAD.
        max_seq_len: the longest input without BOS (``n_ctx - 1``).
        bos: the BOS token (first of every input); ``pad``: the PAD token (never fed here).
        token_ids: the input encoding, token by id (``token_ids[i]`` is the token with id ``i``;
            BOS and PAD included).
        output: ``"categorical"`` or ``"numerical"``.
        output_values: the output decoding, value by logit index (categorical); ``()`` if numerical.
        residual_labels: the label of every residual direction (tracr's ``"name:value"``).
        writes: residual labels each sender writes (plus ``"embed.tokens"``, ``"embed.pos"``).
        reads: residual labels each receiver reads.
        edges: the ground-truth edges ``(sender, receiver)``.
        versions: tracr, JAX, TransformerLens and torch versions the compilation ran with.
    """

    name: str
    description: str
    vocab: tuple[Value, ...]
    max_seq_len: int
    bos: str
    pad: str
    token_ids: tuple[Value, ...]
    output: Literal["categorical", "numerical"]
    output_values: tuple[Value, ...]
    residual_labels: tuple[str, ...]
    writes: Mapping[str, frozenset[str]]
    reads: Mapping[str, frozenset[str]]
    edges: frozenset[tuple[str, str]]
    versions: Mapping[str, str]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TracrMetadata":
        """From the ``"tracr"`` dictionary of a checkpoint's metadata (see :func:`metadata`)."""
        return cls(
            name=data["program"],
            description=data["description"],
            vocab=tuple(data["vocab"]),
            max_seq_len=int(data["max_seq_len"]),
            bos=data["bos"],
            pad=data["pad"],
            token_ids=tuple(data["token_ids"]),
            output=data["output"],
            output_values=tuple(data["output_values"] or ()),
            residual_labels=tuple(data["residual_labels"]),
            writes={k: frozenset(v) for k, v in data["writes"].items()},
            reads={k: frozenset(v) for k, v in data["reads"].items()},
            edges=frozenset((s, r) for s, r in data["edges"]),
            versions=dict(data["versions"]),
        )

    @property
    def token_id(self) -> dict[Value, int]:
        """The input encoding map, token to id."""
        return {t: i for i, t in enumerate(self.token_ids)}


def metadata(name: str) -> TracrMetadata:
    """The metadata of the shipped compiled model ``name`` (read once).

    >>> m = metadata("tracr-reverse")
    >>> m.vocab, m.max_seq_len, m.bos, m.output, m.output_values
    ((1, 2, 3), 5, 'BOS', 'categorical', (1, 2, 3))
    """
    return _metadata(_program(name))


@functools.lru_cache(maxsize=None)
def _metadata(program: str) -> TracrMetadata:
    data = _models.read_metadata(toy_model_path(f"tracr-{program}"))
    if "tracr" not in data:
        raise ValueError(f"the checkpoint tracr-{program} has no tracr metadata")
    return TracrMetadata.from_json(data["tracr"])


def load_tracr_model(name: str) -> Model:
    """``load_toy_model("tracr-" + program)``: the compiled model, on either TransformerLens version.

    >>> load_tracr_model("hist").cfg.n_layers
    1
    """
    return load_toy_model(f"tracr-{_program(name)}")


def ground_truth_edges(name: str) -> frozenset[tuple[str, str]]:
    """The compiled model's edges ``(sender, receiver)``, derived from its residual labels.

    >>> edges = ground_truth_edges("tracr-hist")
    >>> ("embed", "L0H0.q") in edges and ("MLP0", "logits") in edges
    True
    >>> all(depth(s) < depth(r) for s, r in edges)   # rs_interp.circuits.graph.depth
    True
    """
    return metadata(name).edges




def component_weights(model: Model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Each sender's output map and each receiver's input map as ``(d_model, ...)`` matrices whose
    rows are residual directions: ``W_E``/``W_pos`` (transposed), ``W_O[h]`` (transposed), ``W_out``
    (transposed); ``W_Q[h]``, ``W_K[h]``, ``W_V[h]``, ``W_in``, ``W_U``. A direction is written
    (read) iff its row is nonzero.

    >>> write, read = component_weights(load_tracr_model("reverse"))
    >>> write["embed"].shape, read["logits"].shape
    (torch.Size([41, 11]), torch.Size([41, 3]))
    """
    cfg = model.cfg
    write = {"embed": torch.cat([model.W_E.T, model.W_pos.T], dim=1)}
    read: dict[str, torch.Tensor] = {}
    for l in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            write[f"L{l}H{h}"] = model.W_O[l, h].T
            for x, W in (("q", model.W_Q), ("k", model.W_K), ("v", model.W_V)):
                read[f"L{l}H{h}.{x}"] = W[l, h]
        write[f"MLP{l}"] = model.W_out[l].T
        read[f"MLP{l}"] = model.W_in[l]
    read["logits"] = model.W_U
    return {k: v.detach() for k, v in write.items()}, {k: v.detach() for k, v in read.items()}


# --- encoding, decoding, running --------------------------------------------------------------------

def encode(name: str, inputs: Sequence[Sequence[Value]]) -> Int[torch.Tensor, "batch pos"]:
    """Token ids of equal-length input sequences, each with the BOS prepended.

    Raises:
        ValueError: an unknown token, sequences of different lengths, an empty or too long one.

    >>> encode("reverse", [[1, 2, 3], [3, 3, 1]])
    tensor([[3, 0, 1, 2],
            [3, 2, 2, 0]])
    """
    meta = metadata(name)
    ids = meta.token_id
    lengths = {len(x) for x in inputs}
    if len(lengths) != 1:
        raise ValueError("inputs must be a non-empty list of sequences of one length, got lengths "
                         f"{few(sorted(lengths))}")
    (n,) = lengths
    if not 1 <= n <= meta.max_seq_len:
        raise ValueError(f"input length must be in [1, {meta.max_seq_len}] for {meta.name}, got {n}")
    rows = []
    for x in inputs:
        unknown = [t for t in x if t not in meta.vocab]
        if unknown:
            raise ValueError(f"tokens {few(unknown)} are not in {meta.name}'s vocabulary {few(meta.vocab, 8)}")
        rows.append([ids[meta.bos]] + [ids[t] for t in x])
    return torch.tensor(rows, dtype=torch.long)


def decode(name: str, logits_or_outputs: Float[torch.Tensor, "batch pos d_vocab_out"] | Int[torch.Tensor, "batch pos"]
           ) -> list[list[Value]]:
    """The program's outputs from the model's logits (or, categorical, from output indices), the
    BOS position dropped: the output value of the largest logit (categorical) or the single
    logit itself (numerical).

    >>> model = load_tracr_model("frac_prevs")
    >>> logits = model(encode("frac_prevs", [["x", "y", "y", "x"]]))
    >>> [[round(v, 4) for v in row] for row in decode("frac_prevs", logits)]
    [[1.0, 0.5, 0.3333, 0.5]]
    """
    meta = metadata(name)
    t = logits_or_outputs.detach()
    if meta.output == "numerical":
        if t.ndim != 3 or t.shape[-1] != 1:
            raise ValueError(f"{meta.name} has a numerical output: logits must be (batch, pos, 1), got "
                             f"{tuple(t.shape)}")
        return [[float(v) for v in row[1:, 0]] for row in t]
    if t.is_floating_point():
        if t.ndim != 3 or t.shape[-1] != len(meta.output_values):
            raise ValueError(f"logits must be (batch, pos, {len(meta.output_values)}), got {tuple(t.shape)}")
        t = t.argmax(-1)
    if t.ndim != 2:
        raise ValueError(f"output indices must be (batch, pos), got {tuple(t.shape)}")
    return [[meta.output_values[int(i)] for i in row[1:]] for row in t]


_SHAPE_FIELDS = ("n_layers", "n_heads", "d_head", "d_model", "d_mlp", "d_vocab", "d_vocab_out", "n_ctx")


@functools.lru_cache(maxsize=None)
def _shape(program: str) -> tuple[int, ...]:
    path = toy_model_path(f"tracr-{program}")
    path = path.with_name(path.name + ".json")
    with parsing(path, "checkpoint config"):
        config = read_json(path, "checkpoint config")["config"]
        return tuple(config[k] for k in _SHAPE_FIELDS)


def program_of(model: Model) -> str:
    """Which shipped compiled program ``model`` is: its ``cfg.model_name`` where that names one
    (TransformerLens 3.x keeps it), else the one program whose config has the model's shape (4.x's
    native bridges call every model ``"native"``).

    Raises:
        ValueError: no shipped program, or more than one, has that shape.

    >>> program_of(load_tracr_model("tracr-sort"))
    'tracr-sort'
    """
    name = getattr(model.cfg, "model_name", None)
    if isinstance(name, str) and name.removeprefix("tracr-") in PROGRAMS:
        return f"tracr-{name.removeprefix('tracr-')}"
    shape = tuple(getattr(model.cfg, k) for k in _SHAPE_FIELDS)
    found = [p for p in PROGRAMS if _shape(p) == shape]
    if len(found) != 1:
        raise ValueError(f"cannot tell which compiled program the model is ({len(found)} match its shape); pass name=")
    return f"tracr-{found[0]}"


def run_program(model: Model, inputs: Sequence[Sequence[Value]], *, name: str | None = None) -> list[list[Value]]:
    """Run a compiled model on input sequences of any lengths (grouped by length, no padding) and
    decode: one output sequence per input, in order. ``name`` defaults to :func:`program_of`.

    >>> model = load_tracr_model("tracr-sort")
    >>> run_program(model, [[4, 1, 3], [2, 2, 1, 4, 1]])
    [[1, 3, 4], [1, 1, 2, 2, 4]]
    """
    meta = metadata(name if name is not None else program_of(model))
    out: list[list[Value] | None] = [None] * len(inputs)
    by_length: dict[int, list[int]] = {}
    for i, x in enumerate(inputs):
        by_length.setdefault(len(x), []).append(i)
    with torch.no_grad():
        for _, idx in sorted(by_length.items()):
            logits = model(encode(meta.name, [inputs[i] for i in idx]), return_type="logits")
            for i, y in zip(idx, decode(meta.name, logits)):
                out[i] = y
    return out  # type: ignore[return-value]
