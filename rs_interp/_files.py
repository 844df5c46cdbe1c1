"""Reading files, checked: one error type for every file rs_interp reads, and one reader per kind of file.

A missing, truncated, corrupted or malformed file raises :class:`FileError` (a ``ValueError``) naming the
file and what is wrong, never another library's raw exception (``OSError``, ``JSONDecodeError``,
``SafetensorError: header too small``). Every reader of the library goes through these helpers:
:func:`read_json`, :func:`read_text`, :func:`read_safetensors`, :func:`safetensors_metadata`,
:func:`read_torch` and :func:`read_csv` read a file whole; :func:`parsing` turns what goes wrong while a
file's contents are taken apart (a missing key, a tensor of the wrong shape) into the same error, and
:func:`loading` what another library's reader raises on a file it opens itself (transformers, tokenizers);
:func:`digest` is the sha256 of a tensor that :func:`rs_interp.models.save_model` stores and
:func:`rs_interp.models.load_model` checks.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "cfg.json"
>>> _ = path.write_text("{not json")
>>> try:
...     read_json(path, "config")
... except FileError as err:
...     print(str(err).replace(str(path), "PATH"))
config PATH is not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeVar

from ._messages import clip, few

if TYPE_CHECKING:  # torch is imported where a tensor is read: a reader of JSON or text stays light
    import torch

T = TypeVar("T")

__all__ = ["FileError", "existing", "read_bytes", "read_text", "read_json", "read_csv", "read_safetensors",
           "safetensors_metadata", "read_torch", "parsing", "reads", "loading", "need", "check_shape", "digest",
           "json_digest", "finite_json"]


class FileError(ValueError):
    """A file rs_interp reads is missing, truncated, corrupted or malformed; the message names the file and
    what is wrong, and ``path`` holds the file. A ``ValueError``, so code that catches bad input catches it
    too (:class:`rs_interp.models.CheckpointError`, a checkpoint's, is one).

    >>> import tempfile
    >>> try:
    ...     read_json(tempfile.mkdtemp() + "/absent.json", "config")
    ... except FileError as err:
    ...     print(isinstance(err, ValueError), err.path.name, "does not exist" in str(err))
    True absent.json True
    """

    def __init__(self, message: str, path: str | Path | None = None):
        super().__init__(message)
        self.path = None if path is None else Path(path)


def existing(path: str | Path, what: str) -> Path:
    """``path`` as a ``Path``, refused unless it is a file (for a file another library opens: :func:`loading`)."""
    p = Path(path)
    if not p.exists():
        raise FileError(f"{what} {p} does not exist.", p)
    if not p.is_file():
        raise FileError(f"{what} {p} is a folder, not a file.", p)
    return p


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of ``path`` (``what`` names it in the message: ``"config"``, ``"transcoder file"``)."""
    p = existing(path, what)
    try:
        return p.read_bytes()
    except OSError as err:
        raise FileError(f"{what} {p} cannot be read ({err.strerror or clip(err)}).", p) from err


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of ``path``."""
    p = Path(path)
    data = read_bytes(p, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileError(f"{what} {p} is not UTF-8 text (byte {err.start} of {len(data)}).", p) from err


def read_json(path: str | Path, what: str, *, expect: type | None = dict) -> Any:
    """The JSON value in ``path``: of type ``expect`` (an object by default; ``None``: any).

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "x.json"
    >>> _ = path.write_text('{"a": 1}')
    >>> read_json(path, "file")
    {'a': 1}
    """
    p = Path(path)
    text = read_text(p, what)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise FileError(f"{what} {p} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}).",
                        p) from err
    if expect is not None and not isinstance(value, expect):
        kind = {dict: "an object", list: "a list"}.get(expect, expect.__name__)
        raise FileError(f"{what} {p} holds a JSON {type(value).__name__}, not {kind}.", p)
    return value


def read_csv(path: str | Path, what: str) -> list[dict[str, str]]:
    """The rows of the CSV file ``path`` as dictionaries keyed by its header."""
    p = Path(path)
    text = read_text(p, what)
    try:
        return list(csv.DictReader(io.StringIO(text, newline="")))
    except csv.Error as err:
        raise FileError(f"{what} {p} is not a valid CSV file ({clip(err)}).", p) from err


def read_safetensors(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file ``path``, on the CPU."""
    from safetensors.torch import load_file

    p = existing(path, what)
    try:
        return load_file(str(p))
    except Exception as err:  # SafetensorError, OSError, an unknown dtype: all mean the file is not one
        raise FileError(f"{what} {p} is truncated or not a safetensors file ({clip(err, 120)}).", p) from err


def safetensors_metadata(path: str | Path, what: str) -> dict[str, str]:
    """The string metadata in the header of the safetensors file ``path`` (the header checked whole)."""
    from safetensors import safe_open

    p = existing(path, what)
    try:
        with safe_open(str(p), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as err:  # as read_safetensors
        raise FileError(f"{what} {p} is truncated or not a safetensors file ({clip(err, 120)}).", p) from err


def read_torch(path: str | Path, what: str) -> Any:
    """What ``torch.load`` reads from ``path`` with ``weights_only=True`` (tensors and plain containers; nothing
    else is ever unpickled here), on the CPU."""
    import torch

    p = existing(path, what)
    try:
        return torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as err:  # a bad zip archive, a refused object, a truncated stream: not a PyTorch file of tensors
        raise FileError(f"{what} {p} is truncated or not a PyTorch file ({type(err).__name__}: {clip(err, 120)}).",
                        p) from err


def _reason(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"it has no {err.args[0]!r}" if err.args else "a key is missing"
    return clip(err, 200)


@contextlib.contextmanager
def parsing(path: str | Path, what: str, *, files: Iterable[str] = ()) -> Iterator[None]:
    """For the duration, what goes wrong while the contents of ``path`` are taken apart (a missing key, a
    value of the wrong type, a tensor of the wrong shape: ``KeyError``, ``IndexError``, ``TypeError``,
    ``AttributeError``, ``RuntimeError`` or a ``ValueError``; an ``OSError`` of a file the block opens) is a
    :class:`FileError` naming the file; a ``FileError`` passes as it is, and so does a refusal that already
    names ``path`` or one of ``files`` (the files a list's ``path`` abbreviates).

    >>> try:
    ...     with parsing("t.pt", "transcoder file"):
    ...         {}["W_enc"]
    ... except FileError as err:
    ...     print(err)
    transcoder file t.pt is malformed: it has no 'W_enc'.
    """
    try:
        yield
    except FileError:
        raise
    except OSError as err:  # a file inside a folder, opened by the code in the block
        raise FileError(f"{what} {path} cannot be read ({err.strerror or type(err).__name__}: {err.filename}).",
                        path) from err
    except (KeyError, IndexError, TypeError, AttributeError, RuntimeError, ValueError) as err:
        if isinstance(err, ValueError) and any(str(f) in str(err) for f in (str(path), *files)):
            raise FileError(str(err), path) from err  # a refusal that already names the file
        raise FileError(f"{what} {path} is malformed: {_reason(err).rstrip('.')}.", path) from err


def reads(what: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A reader's decorator: what goes wrong while it takes its files apart (as :func:`parsing`) is a
    :class:`FileError` naming its first argument, the file or folder it reads (or a few of a list of files).

    >>> @reads("transcoder folder")
    ... def load(folder):
    ...     return {}["W_enc"]
    >>> try:
    ...     load("tcs")
    ... except FileError as err:
    ...     print(err)
    transcoder folder tcs is malformed: it has no 'W_enc'.
    """
    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def reader(source: Any, *args: Any, **kwargs: Any) -> T:
            where = few(map(str, source), 2) if isinstance(source, (list, tuple)) else str(source)
            files = tuple(map(str, source)) if isinstance(source, (list, tuple)) else ()
            with parsing(where, what, files=files):
                return fn(source, *args, **kwargs)
        return reader
    return decorate


@contextlib.contextmanager
def loading(path: str | Path, what: str, reader: str) -> Iterator[None]:
    """For the duration, any error another library's reader (``reader``: ``"transformers"``, ``"tokenizers"``)
    raises on ``path`` is a :class:`FileError` naming the file; a ``FileError`` passes as it is. For files
    that library reads itself (a Hugging Face folder's weights, a tokenizer's JSON), whose errors come in many types.

    >>> try:
    ...     with loading("tok.json", "tokenizer", "tokenizers"):
    ...         raise Exception("expected value at line 1 column 1")
    ... except FileError as err:
    ...     print(err)
    tokenizer tok.json cannot be read by tokenizers (Exception: expected value at line 1 column 1).
    """
    try:
        yield
    except FileError:
        raise
    except Exception as err:  # noqa: BLE001  (the other library's errors, whatever their type)
        raise FileError(f"{what} {path} cannot be read by {reader} ({type(err).__name__}: {clip(err, 160)}).",
                        path) from err


def need(found: Iterable[str], wanted: Iterable[str], path: str | Path, what: str) -> None:
    """Refuse ``path`` unless ``found`` (its keys or tensor names) holds every name of ``wanted``."""
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise FileError(f"{what} {path} lacks {few(missing)}.", path)


def check_shape(tensor: torch.Tensor, shape: tuple[int, ...], name: str, path: str | Path, what: str) -> None:
    """Refuse ``path`` unless its tensor ``name`` has ``shape``."""
    if tuple(tensor.shape) != tuple(shape):
        raise FileError(f"{what} {path}: tensor {name!r} has shape {tuple(tensor.shape)}, not {tuple(shape)}.", path)


def digest(tensor: torch.Tensor) -> str:
    """The sha256 of a tensor's dtype, shape and bytes (what :func:`rs_interp.models.save_model` stores).

    >>> import torch
    >>> zeros = torch.zeros(2)
    >>> digest(zeros) == digest(torch.zeros(2)), digest(zeros) == digest(torch.zeros(2, dtype=torch.float64))
    (True, False)
    """
    import torch

    t = tensor.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def json_digest(value: Any) -> str:
    """The sha256 of a JSON value in one canonical form (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def finite_json(x: Any) -> Any:
    """``x`` (dicts, lists and tuples of plain values) with every non-finite float written ``None``: NaN and
    infinity are not JSON, ``null`` is (a curve's value where a circuit's metric was undefined). The one
    cleaner of the JSON files rs_interp writes (the reproduction's results, ``rs-interp circuit``'s summary).

    >>> finite_json({"a": [1.0, float("nan")], "b": (float("inf"), "x")})
    {'a': [1.0, None], 'b': [None, 'x']}
    """
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x
