"""circuit-tracer's ``config.yaml``, read and written without a YAML library (private).

The configs of per-layer transcoder sets are flat: ``key: scalar`` lines and one list of paths
(``transcoders:`` then ``- path`` lines, or ``[a, b]``). This reads exactly that subset (quoted or
bare strings, integers, floats, booleans, null, comments) and refuses anything else with a
``ValueError`` naming the line, rather than guess; it writes the same subset (strings JSON-quoted,
which YAML reads as they are).
"""

from __future__ import annotations

import json
import re

__all__: list[str] = []

_KEY = re.compile(r"^([A-Za-z_][\w.-]*)\s*:(?:\s+(.*))?$")


def _strip_comment(text: str) -> str:
    """``text`` without a trailing ``# comment`` (a ``#`` inside quotes stays)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text.rstrip()


def _scalar(text: str, where: str):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return json.loads(text)
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if text in ("null", "~", "Null", "NULL", ""):
        return None
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", text):
        return float(text)
    if text[0] in "[{&*!|>%@`" or ": " in text:
        raise ValueError(f"config.yaml {where}: {text!r} is not a scalar this reader knows (a flat config only)")
    return text


def _flow_list(text: str, where: str) -> list:
    inner = text.strip()[1:-1].strip()
    if not inner:
        return []
    items, quote, start = [], None, 0
    for i, ch in enumerate(inner):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    return [_scalar(x, where) for x in items]


def loads(text: str) -> dict:
    """The config's keys and values.

    >>> loads('model_kind: transcoder_set  # a set\\nk: 32\\ntranscoders:\\n  - "a.safetensors"\\n  - b.safetensors\\n')
    {'model_kind': 'transcoder_set', 'k': 32, 'transcoders': ['a.safetensors', 'b.safetensors']}
    """
    out: dict = {}
    listing: str | None = None
    blocks: set[str] = set()  # keys with nothing after the colon: a block list, or null if no item follows
    for n, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw)
        where = f"line {n}"
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        stripped = line.lstrip()
        if stripped.startswith("- ") or stripped == "-":
            if listing is None:
                raise ValueError(f"config.yaml {where}: a list item outside a list")
            out[listing].append(_scalar(stripped[1:], where))
            blocks.discard(listing)
            continue
        if line != stripped:
            raise ValueError(f"config.yaml {where}: nested mappings are not part of a transcoder-set config")
        match = _KEY.match(line)
        if not match:
            raise ValueError(f"config.yaml {where}: expected `key: value`, got {line!r}")
        key, value = match.group(1), match.group(2)
        if key in out:
            raise ValueError(f"config.yaml {where}: {key!r} given twice")
        listing = None
        if value is None or not value.strip():
            out[key], listing = [], key
            blocks.add(key)
        elif value.strip().startswith("["):
            if not value.strip().endswith("]"):
                raise ValueError(f"config.yaml {where}: a flow list must close on its line")
            out[key] = _flow_list(value, where)
        else:
            out[key] = _scalar(value, where)
    return {k: (None if k in blocks else v) for k, v in out.items()}


def dumps(config: dict) -> str:
    """The config as the flat YAML :func:`loads` reads (and any YAML reader).

    >>> loads(dumps({"scan": "x: y", "k": 3, "transcoders": ["a", "b"]}))
    {'scan': 'x: y', 'k': 3, 'transcoders': ['a', 'b']}
    """
    lines = []
    for key, value in config.items():
        if isinstance(value, (list, tuple)):
            lines.append(f"{key}:")
            lines += [f"  - {json.dumps(v)}" for v in value]
        elif value is None:
            lines.append(f"{key}: null")
        elif isinstance(value, bool):
            lines.append(f"{key}: {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key}: {value!r}")
        else:
            lines.append(f"{key}: {json.dumps(str(value))}")
    return "\n".join(lines) + "\n"
