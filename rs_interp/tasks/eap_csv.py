"""Tasks in EAP-IG's file format, its task CSV.

**EAP-IG's CSV** (``hannamw/EAP-IG``, ``hannamw/eap-ig-faithfulness``): one row per prompt pair,
``clean,corrupted`` and the task's label columns: IOI ``correct_idx,incorrect_idx`` (token ids),
greater-than ``label`` (the start year's yy; ``correct_idx`` in eap-ig-faithfulness), SVA ``plural``
(1 where the clean subject is plural). Texts carry no BOS (EAP-IG adds it when tokenizing), so
:func:`read_eap_csv` with ``prepend_bos=True`` gives back the tokens :func:`write_eap_csv` wrote.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

from .._files import FileError, read_csv
from .._messages import clip, few
from .greater_than import year_tokens
from .sva import VERBS, verb_ids
from .task import Task, pack, resolve_tokenizer

__all__ = ["write_eap_csv", "read_eap_csv"]

#: EAP-IG's label columns per task (greater-than: also eap-ig-faithfulness's ``correct_idx``).
_COLUMNS = {"ioi": ("correct_idx", "incorrect_idx"), "greater-than": ("label",), "sva": ("plural",)}



def write_eap_csv(task: Task, path: str | Path) -> Path:
    """Write ``task`` as EAP-IG's CSV (module docstring), its folder made if needed; returns the path.

    Raises:
        ValueError: a task with no texts (induction), or one whose label columns EAP-IG does not define.

    Example:
        >>> import tempfile
        >>> from rs_interp.tokenizers import gpt2_tokenizer
        >>> from rs_interp.tasks import greater_than_task
        >>> path = write_eap_csv(greater_than_task(gpt2_tokenizer(), 2, seed=0), tempfile.mkdtemp() + "/gt.csv")
        >>> print("\\n".join(path.read_text().splitlines()[:2]))
        clean,corrupted,label
        The testing lasted from the year 1578 to 15,The testing lasted from the year 1501 to 15,78
    """
    if task.prompts is None or task.corrupted_prompts is None:
        raise ValueError(f"the {task.name} task has no texts (token ids only): EAP-IG's CSV holds texts")
    if task.name not in _COLUMNS:
        raise ValueError(f"EAP-IG's CSV has no label columns for a {task.name!r} task; it has {sorted(_COLUMNS)}")
    if task.name == "ioi":
        if task.answers.shape[1] != 1 or task.wrong.shape[1] != 1:
            raise ValueError("an ioi task has one answer and one wrong id per row")
        labels = [[int(a), int(w)] for a, w in zip(task.answers[:, 0], task.wrong[:, 0])]
    else:
        if task.label is None:
            raise ValueError(f"this {task.name} task has no label to write")
        labels = [[int(v)] for v in task.label]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["clean", "corrupted", *_COLUMNS[task.name]])
        for c, x, lab in zip(task.prompts, task.corrupted_prompts, labels):
            out.writerow([c, x, *lab])
    return path


def read_eap_csv(path: str | Path, task: str, tokenizer: Any, *, prepend_bos: bool = True,
                 verbs: Sequence[tuple[str, str]] = VERBS) -> Task:
    """A :class:`Task` from EAP-IG's CSV (module docstring; other columns, such as pandas' index or
    ``corrupted_hard``, are ignored).

    Args:
        task: ``"ioi"``, ``"greater-than"`` or ``"sva"``: which label columns to read.
        tokenizer: a Hugging Face tokenizer, a ``tokenizers.Tokenizer``, or a model carrying one.
        prepend_bos: start every prompt with the tokenizer's BOS (EAP-IG does).
        verbs: SVA's verb forms (as :func:`rs_interp.tasks.sva_task`).

    Raises:
        rs_interp.FileError: (a ``ValueError``) the file missing, not UTF-8 or not CSV, no rows, a column
            missing, a label that is not an integer in range (the file and row named).
        ValueError: an unknown task, or a pair of different token lengths (the row is named).
    """
    if task not in _COLUMNS:
        raise ValueError(f"task must be one of {sorted(_COLUMNS)}, got {task!r}")
    tok = resolve_tokenizer(tokenizer)
    rows = read_csv(path, "EAP-IG CSV")
    if not rows:
        raise FileError(f"EAP-IG CSV {path} has no rows.", path)
    cols = _COLUMNS[task]
    if task == "greater-than" and "label" not in rows[0] and "correct_idx" in rows[0]:
        cols = ("correct_idx",)  # eap-ig-faithfulness's name for the same column
    missing = [c for c in ("clean", "corrupted", *cols) if c not in rows[0]]
    if missing:
        raise FileError(f"EAP-IG CSV {path} has no column {few(missing, show=str)} (a {task} CSV has clean, corrupted, "
                        f"{few(cols, show=str)}).", path)

    def integer(i: int, col: str, lo: int, hi: int) -> int:
        text = rows[i][col]
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise FileError(f"EAP-IG CSV {path} row {i}: {col} is {clip(repr(text), 40)}, not an integer.",
                            path) from None
        if not lo <= value < hi:
            raise FileError(f"EAP-IG CSV {path} row {i}: {col} {value} is outside [{lo}, {hi}).", path)
        return value

    clean, corrupted = [r["clean"] for r in rows], [r["corrupted"] for r in rows]
    label = None
    if task == "ioi":
        vocab = len(tok) if hasattr(tok, "__len__") else tok.get_vocab_size()
        answers = [[integer(i, "correct_idx", 0, vocab)] for i in range(len(rows))]
        wrong = [[integer(i, "incorrect_idx", 0, vocab)] for i in range(len(rows))]
        kind = "logit_diff"
    elif task == "greater-than":
        digits = year_tokens(tok)
        label = [integer(i, cols[0], 0, 99) for i in range(len(rows))]
        answers, wrong, kind = [digits[y + 1:] for y in label], [digits[: y + 1] for y in label], "prob_diff"
    else:
        singular, plural = verb_ids(tok, verbs)
        label = [integer(i, "plural", 0, 2) for i in range(len(rows))]
        answers = [plural if p else singular for p in label]
        wrong = [singular if p else plural for p in label]
        kind = "prob_diff"
    return pack(tok, task, clean, corrupted, answers, wrong, kind=kind, prepend_bos=prepend_bos, seed=None, label=label)
