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


def seed(text: str) -> int:
    """A non-negative integer (a seed), checked at parse time rather than after minutes of work."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seed {text!r}: a non-negative integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid seed {value}: a non-negative integer")
    return value


def count(text: str) -> int:
    """A positive integer (a count: prompts, steps, a batch size, processes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid count {value}: at least 1")
    return value


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
