"""The command line's argument checks (private): light (no torch, no TransformerLens), so a bad argument
is refused before anything heavy loads. ``argparse`` types raise :class:`argparse.ArgumentTypeError`
(one line, exit code 2); :func:`writable_dir` raises :class:`OSError` (one line, exit code 1).

>>> seed("3"), count("2")
(3, 2)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

__all__ = ["seed", "count", "writable_dir"]


def _integer(text: str, what: str, least: int, wording: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: {wording}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"invalid {what} {value}: {wording if least == 0 else f'at least {least}'}")
    return value


def seed(text: str) -> int:
    """A non-negative integer (a seed), checked at parse time rather than after minutes of work."""
    return _integer(text, "seed", 0, "a non-negative integer")


def count(text: str) -> int:
    """A positive integer (a count: prompts, steps, a batch size, processes)."""
    return _integer(text, "count", 1, "a positive integer")


def writable_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create ``path`` if needed and prove it writable, before any long work (one clear line if not).

    Raises:
        OSError: ``path`` cannot be made or written (under a file, no permission), naming ``flag``.
    """
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            pass
    except OSError as err:
        raise OSError(f"{flag} {str(path)!r} is not a writable directory: {err.strerror or err}") from None
    return out
