"""``rs-interp circuit``'s arguments (private; :mod:`rs_interp.ui.circuit_command` exports them): declared,
checked before torch or a model loads, and the model they name loaded.

>>> _size("0.5"), _size("12")
(0.5, 12)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Iterator

from .._messages import few
from ._args import count, seed, writable_dir

__all__ = ["COMMAND_METHODS", "add_arguments", "check_arguments", "load_command_model", "command_task", "rs_checkpoint"]



class _Commands:
    """The registry's methods that ``rs-interp circuit`` runs, by their command names (:attr:`Method.command
    <rs_interp.circuits.methods.Method.command>`), read from the registry on first use: ``--help`` and the other
    arguments' checks load no torch; ``--method`` loads the registry to check its value (a wrong name is answered
    with the list)."""

    def _methods(self) -> dict[str, Any]:
        from ..circuits.methods import METHODS

        return {m.command: m for m in METHODS.values() if m.command is not None}

    def __contains__(self, name: object) -> bool:
        return name in self._methods()

    def __iter__(self) -> Iterator[str]:
        return iter(self._methods())

    def __len__(self) -> int:
        return len(self._methods())

    def __getitem__(self, name: str) -> Any:
        """The registry entry of the command name ``name``."""
        return self._methods()[name]

    def __repr__(self) -> str:
        return "COMMAND_METHODS (the methods registry's command names)"


class _MethodName(argparse.Action):
    """``--method``: a command name of the registry, checked when given (the default is one: not checked, so a
    run that leaves it out checks its other arguments with no torch loaded)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any,
                 option: str | None = None) -> None:
        if value not in COMMAND_METHODS:
            parser.error(f"argument --method: invalid choice: {value!r} (choose from {', '.join(COMMAND_METHODS)})")
        setattr(namespace, self.dest, value)


#: The edge-scoring methods of ``rs-interp circuit``: the registry's entries with a command name (``eap``, ``eap-ig``,
#: ``exact``, ``relp`` ...), ``COMMAND_METHODS[name]`` the entry.
COMMAND_METHODS = _Commands()


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Declare ``rs-interp circuit``'s arguments on ``parser`` (a subparser); returns it. Each is checked
    at parse time where it can be (a count, a seed, a size); :func:`check_arguments` checks the rest
    before anything heavy loads."""
    from ..models.registry import SHIPPED_MODELS as SHIPPED
    from ..tasks import TASK_NAMES

    parser.add_argument("--model", required=True, metavar="MODEL",
                        help="required: gpt2 (pretrained: $RS_INTERP_GPT2_PATH or the Hugging Face cache), "
                             "gpt2-random, a shipped model's name (" + ", ".join(SHIPPED) + "), a Hugging Face "
                             "checkpoint directory, or an rs_interp checkpoint (rs_interp.models.save_model's or "
                             "rs-interp train's: PATH of PATH.json and PATH.safetensors, or the folder holding one)")
    parser.add_argument("--task", required=True, choices=TASK_NAMES,
                        help="required: the task (" + ", ".join(TASK_NAMES) + ")")
    parser.add_argument("--method", default="eap", action=_MethodName, metavar="METHOD",
                        help="edge scores: a method of the registry (rs_interp.circuits.methods.METHODS) by its "
                             "command name, e.g. eap (one backward pass), eap-ig (--ig-steps of them), exact (path "
                             "patching: one patched pass per edge, for small models; GPT-2 small has 32,491 edges), "
                             "relp (relevance patching); a wrong name is answered with the list (default: "
                             "%(default)s)")
    parser.add_argument("--out", required=True, metavar="DIR", help="required: the output directory (made if needed)")
    parser.add_argument("--size", type=_size, default=None, metavar="N|F",
                        help="the circuit's size: an edge count, or a fraction of the edges in (0, 1], then pruned to "
                             "the edges on a path from the embedding to the logits (default: the smallest circuit on "
                             "the faithfulness curve that recovers --share of the metric)")
    parser.add_argument("--share", type=_share, default=None, metavar="F",
                        help="without --size, the share of the metric the circuit recovers: its faithfulness, in "
                             "(0, 1] (default: 0.8, rs_interp.circuits.selection.RECOVERED_SHARE)")
    parser.add_argument("--n", type=count, default=32, metavar="N", help="prompt pairs (default: %(default)s)")
    parser.add_argument("--seed", type=seed, default=0, help="the task's seed (default: %(default)s)")
    parser.add_argument("--ig-steps", type=count, default=5, metavar="M", help="EAP-IG's steps (default: %(default)s)")
    parser.add_argument("--batch-size", type=count, default=None, metavar="B",
                        help="prompt pairs per batch: memory holds one batch, the results are the whole task's; each "
                             "batch repeats the per-batch work (choosing the curve's circuits, each circuit's pass), "
                             "so fewer, larger batches are faster (default: the whole task; under torchrun an even "
                             "share per rank)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars (default: bars on stderr)")
    return parser


def _in_unit(text: str, what: str, not_a_number: str, outside: str) -> float:
    """A number in (0, 1], checked at parse time; the two refusals' wordings given."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: {not_a_number}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: {outside}")
    return value


def _share(text: str) -> float:
    """A share of the metric in (0, 1], checked at parse time."""
    return _in_unit(text, "share", "a number in (0, 1]", "a share lies in (0, 1]")


def _size(text: str) -> int | float:
    """An edge count (an integer >= 1) or a fraction of the edges in (0, 1], checked at parse time."""
    try:
        value = int(text)
    except ValueError:
        return _in_unit(text, "size", "an edge count or a fraction in (0, 1]",
                        "a fraction lies in (0, 1] (an edge count is an integer)")
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: an edge count is at least 1")
    return value


def check_arguments(args: argparse.Namespace) -> Path:
    """What parsing cannot check, before torch or a model loads: ``--model`` names a model this command
    can load (for ``gpt2``, its weights are here), then ``--out`` is (made) a writable directory.
    Returns the output directory.

    Raises:
        ValueError: an unknown ``--model``.
        rs_interp.GPT2WeightsUnavailable: ``--model gpt2`` without its weights.
        OSError: ``--out`` cannot be made or written.
    """
    _check_spec(args.model)
    if args.model == "gpt2":
        _gpt2_source()  # raises, saying how to provide the weights
    return writable_dir(args.out)


def _check_spec(spec: str) -> None:
    """Refuse a ``--model`` that is none of the accepted forms (light: the registry's names, a folder test)."""
    from ..models.registry import SHIPPED_MODELS

    if spec not in ("gpt2", "gpt2-random") and spec not in SHIPPED_MODELS and not Path(spec).is_dir() \
            and rs_checkpoint(spec) is None:
        raise ValueError(f"--model {spec!r} is not gpt2, gpt2-random, a shipped model ({', '.join(SHIPPED_MODELS)}), "
                         "a checkpoint directory or an rs_interp checkpoint (PATH of PATH.json and PATH.safetensors)")


def rs_checkpoint(spec: str | Path) -> Path | None:
    """The rs_interp checkpoint ``spec`` names (:func:`rs_interp.models.save_model`'s ``PATH.json`` and
    ``PATH.safetensors``), as the ``PATH`` :func:`rs_interp.models.load_model` takes: ``spec`` itself (with or
    without either suffix), or the one such pair in the folder ``spec`` (a folder with a Hugging Face
    ``config.json`` is Hugging Face's); None otherwise. Light: reads file names only."""
    path = Path(spec)
    if path.suffix in (".json", ".safetensors"):
        path = path.with_suffix("")
    if path.with_name(path.name + ".json").is_file() and path.with_name(path.name + ".safetensors").is_file():
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(w.with_suffix("") for w in path.glob("*.safetensors") if w.with_suffix(".json").is_file())
        return found[0] if len(found) == 1 else None
    return None


def load_command_model(spec: str) -> tuple[Any, Any, str]:
    """(model, tokenizer or None, description) for ``--model`` (see :func:`add_arguments`).

    Raises:
        rs_interp.WeightsUnavailable: pretrained GPT-2 is not here (the message says how to provide it).
        ValueError: ``spec`` is none of the accepted forms.
    """
    import rs_interp as ri

    from ..tokenizers import GPT2_VOCAB_SIZE, gpt2_tokenizer

    saved = None if spec in ("gpt2", "gpt2-random") or spec in ri.models.SHIPPED_MODELS else rs_checkpoint(spec)
    if spec == "gpt2":
        source = _gpt2_source()
        model = ri.load_gpt2(source)
        what = ("GPT-2 small, pretrained weights from the Hugging Face cache" if source == "hub"
                else f"GPT-2 small, pretrained weights from {source}")
    elif spec == "gpt2-random":
        model, what = ri.load_gpt2("random"), "GPT-2 small, random weights (every number here is from random weights)"
    elif spec in ri.models.SHIPPED_MODELS:
        model, what = ri.load_toy_model(spec), f"{spec} (shipped toy model)"
    elif saved is not None:
        from ..models.checkpoints import load_model

        model, what = load_model(saved), f"rs_interp checkpoint {saved}"
    elif Path(spec).is_dir():
        model, what = ri.load_pretrained(spec), f"checkpoint {spec}"
    else:
        _check_spec(spec)  # raises: none of the accepted forms
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None and saved is not None and saved.with_name(saved.name + ".tokenizer.json").is_file():
        from ..models.code_model import load_code_tokenizer

        tokenizer = load_code_tokenizer(saved)  # saved beside it (rs-interp train code-2l)
    if tokenizer is None and spec in ri.models.SHIPPED_MODELS:
        tokenizer = ri.models.SHIPPED_MODELS[spec].tokenizer()
    if tokenizer is None and model.cfg.d_vocab == GPT2_VOCAB_SIZE:
        tokenizer = gpt2_tokenizer()  # GPT-2's vocabulary: its tokenizer, whatever the weights
    return model, tokenizer, what


def _gpt2_source() -> str:
    """Where ``--model gpt2``'s weights are: ``$RS_INTERP_GPT2_PATH``, or ``"hub"`` (the Hugging Face cache).

    Raises:
        rs_interp.GPT2WeightsUnavailable: neither holds them (the message says how to provide them).
    """
    path = os.environ.get("RS_INTERP_GPT2_PATH")
    if path:
        return path
    if _gpt2_cached():
        return "hub"
    from ..models.pretrained import GPT2WeightsUnavailable

    raise GPT2WeightsUnavailable(
        "no pretrained GPT-2 weights here: RS_INTERP_GPT2_PATH is unset and the Hugging Face cache has no 'gpt2'. "
        "Save them once on a machine with access (GPT2LMHeadModel.from_pretrained('gpt2').save_pretrained(DIR)), "
        "then set RS_INTERP_GPT2_PATH=DIR or pass --model DIR; or run on random weights with --model gpt2-random.")


def _gpt2_cached() -> bool:
    """Whether the Hugging Face cache holds GPT-2's config and weights (no network call)."""
    from huggingface_hub import try_to_load_from_cache

    have = lambda f: isinstance(try_to_load_from_cache("gpt2", f), str)  # noqa: E731
    return have("config.json") and (have("model.safetensors") or have("pytorch_model.bin"))


def command_task(args: argparse.Namespace, tokenizer: Any, model: Any) -> Any:
    """``--task``'s task for ``--model``, its refusal said in the command line's terms: a task whose words are not
    single tokens under the model's tokenizer names the options that change it (the builders' keywords, such as
    ``names=``, are Python's; the command takes none).

    Raises:
        ValueError: the task cannot be built for this model (named with the options to change).
    """
    from ..tasks import NotSingleTokens, build_task

    try:
        return build_task(args.task, tokenizer, n=args.n, seed=args.seed, d_vocab=model.cfg.d_vocab,
                          n_ctx=model.cfg.n_ctx)
    except NotSingleTokens as err:
        shown = few((f"{w!r} -> {n} tokens" for w, n in err.words.items()), 2, show=str)
        raise ValueError(f"--task {args.task} needs {err.what} that are one token each under the tokenizer of --model "
                         f"{args.model}, and {len(err.words)} of its {err.total} are not ({shown}). Choose another "
                         "--task (induction reads no words) or --model; a task of your own words, in a notebook: "
                         "rs_interp.tasks.prompt_task (docs/capabilities/own-task.md).") from None
