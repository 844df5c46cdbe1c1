"""How a refusal reads: at most :data:`LIMIT` characters, complete sentences, long lists shown by a few
entries and a pointer to the rest.

Every message rs_interp raises or warns with is held to this by ``tests/integration/test_messages.py``
(its rules: docs/project/testing.md, "Messages").

>>> few(["a", "b", "c", "d", "e"])
"'a', 'b', 'c' and 2 more"
>>> clip("one two three four", 12)
'one two ...'
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["LIMIT", "few", "clip"]

#: The most characters a refusal or warning may hold (the paths and values in it included).
LIMIT = 400


def few(items: Iterable[Any], k: int = 3, *, show=repr) -> str:
    """The first ``k`` of ``items`` (each by ``show``), then how many more: a list a message can hold.

    >>> few([1, 2]), few(range(10), 2, show=str)
    ('1, 2', '0, 1 and 8 more')
    """
    items = list(items)
    head = ", ".join(show(x) for x in items[:k])
    return head if len(items) <= k else f"{head} and {len(items) - k} more"


def clip(text: Any, n: int = 160) -> str:
    """``str(text)`` on one line, cut at a word boundary to at most ``n`` characters with ``...`` (another
    library's error text, quoted inside one of ours, never ends mid-word without a mark).

    >>> clip("short"), clip("a\\nb")
    ('short', 'a b')
    """
    text = " ".join(str(text).split())
    if len(text) <= n:
        return text
    cut = text[: n - 4].rsplit(" ", 1)[0]
    return f"{cut} ..."
