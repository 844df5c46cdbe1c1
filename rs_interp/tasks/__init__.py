"""The standard circuit tasks behind one small type, :class:`Task`, and their file formats.

- ``tasks.task``: :class:`Task` (clean and corrupted tokens, answer and wrong-answer ids, the read
  positions, ``task.metric()``);
- ``tasks.ioi``: indirect object identification (Wang et al. 2022), ABBA and BABA, the ABC corruption;
- ``tasks.greater_than``: greater-than (Hanna et al. 2023), ACDC's prompt and year filter, "01";
- ``tasks.sva``: subject-verb agreement, same-length singular/plural pairs;
- ``tasks.induction``: repeated random sequences (:func:`rs_interp.induction_batch`);
- ``tasks.prompts``: your own task from your own prompt pairs and answers (:func:`prompt_task`), and which
  words are one token for a model (:func:`word_pieces`, :func:`one_token_words`);
- ``tasks.eap_csv``: EAP-IG's task CSV (the MIB circuit track's graph files describe circuits: they live beside
  them, :mod:`rs_interp.circuits.mib_files`).

Every builder is seeded (the same seed, the same task byte for byte) and refuses, naming the words,
a tokenizer under which its words are not single tokens.

>>> import rs_interp as ri
>>> from rs_interp.tokenizers import gpt2_tokenizer
>>> task = build_task("ioi", gpt2_tokenizer(), n=4, seed=0)
>>> task.name, len(task), task.kind
('ioi', 4, 'logit_diff')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._lazy import attach

#: Every public name and its module, imported on first use (rs_interp._lazy): ``rs-interp circuit --help``
#: reads TASK_NAMES without loading torch.
_WHERE: dict[str, str] = {
    "greater_than_task": ".greater_than",
    "induction_task": ".induction",
    "read_eap_csv": ".eap_csv",
    "write_eap_csv": ".eap_csv",
    "ioi_task": ".ioi",
    "one_token_words": ".prompts",
    "prompt_task": ".prompts",
    "word_pieces": ".prompts",
    "sva_task": ".sva",
    "MetricKind": ".task",
    "Task": ".task",
    "NotSingleTokens": ".task",
}

if TYPE_CHECKING:
    from .eap_csv import read_eap_csv, write_eap_csv
    from .greater_than import greater_than_task
    from .induction import induction_task
    from .ioi import ioi_task
    from .prompts import one_token_words, prompt_task, word_pieces
    from .sva import sva_task
    from .task import MetricKind, NotSingleTokens, Task

#: MIB's graph files moved beside the circuits they describe (issue 65): the old names answer for a release, warning.
_DEPRECATED: dict[str, tuple[str, type[Warning]]] = {
    name: (f"rs_interp.circuits.{name}", DeprecationWarning) for name in (
        "MIBGraph", "write_mib", "read_mib", "write_mib_circuits", "mib_edge_names", "from_mib_edge",
        "mib_importances")}

__getattr__, __dir__ = attach(__name__, _WHERE, globals(), deprecated=_DEPRECATED)

__all__ = [
    "Task", "MetricKind", "NotSingleTokens", "TASK_NAMES", "build_task",
    "ioi_task", "greater_than_task", "sva_task", "induction_task", "prompt_task", "word_pieces", "one_token_words",
    "write_eap_csv", "read_eap_csv",
]

#: The task names :func:`build_task` (and ``rs-interp circuit --task``) accept.
TASK_NAMES = ("ioi", "greater-than", "sva", "induction")


def build_task(name: str, tokenizer: Any = None, *, n: int = 32, seed: int = 0, d_vocab: int | None = None,
               n_ctx: int | None = None) -> Task:
    """The task ``name`` (one of :data:`TASK_NAMES`) with its defaults.

    Args:
        tokenizer: for the text tasks, a tokenizer or a model carrying one (unused by induction).
        n, seed: number of rows and seed.
        d_vocab, n_ctx: induction's token range and a bound on its length (the model's
            ``cfg.d_vocab`` and ``cfg.n_ctx``; defaults 256 and 48 tokens).

    Raises:
        ValueError: an unknown name, a text task without a tokenizer, and the builder's own errors.
    """
    from .greater_than import greater_than_task
    from .induction import induction_task
    from .ioi import ioi_task
    from .sva import sva_task

    if name == "induction":
        seq_len = 48 if n_ctx is None else min(48, n_ctx)
        return induction_task(n, seed=seed, d_vocab=256 if d_vocab is None else d_vocab, seq_len=seq_len,
                              max_period=min(24, seq_len - 1), min_period=min(6, seq_len - 1))
    builders = {"ioi": ioi_task, "greater-than": greater_than_task, "sva": sva_task}
    if name not in builders:
        raise ValueError(f"unknown task {name!r}; the tasks are {', '.join(TASK_NAMES)}")
    if tokenizer is None:
        raise ValueError(f"the {name} task is built from text: it needs a tokenizer (or a model that has one)")
    return builders[name](tokenizer, n, seed=seed)
