"""Issue 51 item 3: one vocabulary. Every public helper's arguments against the table of
docs/getting-started.md ("Arguments: one name, one default"); the renamed keywords kept for one
release with a DeprecationWarning; the memory budget only tiles (the same floats whatever it is)."""

import importlib
import inspect
import pkgutil
import re
import warnings
from pathlib import Path

import pytest
import torch

import rs_interp as ri
import rs_interp.features as F
import rs_interp.models as M
import rs_interp.scale as S
import rs_interp.tasks as T
from rs_interp._budget import MEMORY_BUDGET
from rs_interp._keywords import renamed, renamed_attribute
from rs_interp.circuits import MIB_FRACTIONS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"

#: Retired spellings: never a public helper's parameter again (the old keyword still works, warning).
RETIRED = {"method": "ablation", "nodes": "which", "top_k": "k", "top": "k", "n_logits": "max_logits", "chunk_size": "batch_chunk"}
REQUIRED = object()


def _helpers():
    """Every public function of rs_interp, features, models (the maintainer API), tasks, scale and every other role package, and the public methods of their
    public classes (TransformerLens's ``Model`` aside), by the name a user calls them."""
    seen = set()
    roles = [info.name for info in pkgutil.iter_modules(ri.__path__) if info.ispkg and not info.name.startswith("_")]
    packages = [(ri, ""), (F, "features."), (M, "models."), (T, "tasks."), (S, "scale.")]
    packages += [(importlib.import_module(f"rs_interp.{r}"), f"{r}.") for r in roles if r not in ("features", "models", "tasks", "scale", "reproduce")]
    packages += [(importlib.import_module("rs_interp.reproduce.finance"), "finance.")]  # the case study: ri.finance
    for mod, prefix in packages:
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or name == "Model" or id(obj) in seen:
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                for m, f in vars(obj).items():
                    if not m.startswith("_") and (inspect.isfunction(f) or isinstance(f, (classmethod, staticmethod))):
                        yield f"{prefix}{name}.{m}", getattr(obj, m)
            elif inspect.isfunction(obj):
                yield prefix + name, obj


def _parameters() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for helper, fn in _helpers():
        for p in inspect.signature(fn).parameters.values():
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                out.setdefault(p.name, {})[helper] = REQUIRED if p.default is inspect.Parameter.empty else p.default
    return out


def _table() -> list[tuple[str, dict[str, object], object, list[str]]]:
    """The rows (word, {helper: default} exceptions, the default of the others, helpers)."""
    text = PAGE.read_text()
    body = text[text.index("### Arguments: one name, one default"):]
    rows = [line for line in body.splitlines() if line.startswith("| `")]
    names = {"None": None, "True": True, "False": False, "MEMORY_BUDGET": MEMORY_BUDGET, "MIB_FRACTIONS": MIB_FRACTIONS}
    out = []
    for line in rows:
        word_cell, _, default_cell, helpers_cell = [c.strip() for c in line.strip("|").split(" | ")]
        word = re.findall(r"`([^`]+)`", word_cell)[0]
        spec, rest = {}, REQUIRED
        for entry in re.sub(r"\([^()]*\)", "", default_cell).split(";"):
            entry = entry.strip()
            value = REQUIRED if entry.startswith("required") else eval(re.findall(r"`([^`]+)`", entry)[0], {}, names)  # noqa: S307
            if " in " in entry:
                spec.update({h: value for h in re.findall(r"`([^`]+)`", entry.split(" in ", 1)[1])})
            else:
                rest = value
        out.append((word, spec, rest, re.findall(r"`([^`]+)`", helpers_cell)))
    return out


def _same(a, b) -> bool:
    return a is b if REQUIRED in (a, b) else (tuple(a) == tuple(b) if isinstance(a, (tuple, list)) else a == b)


def test_the_table_lists_every_helper_taking_each_argument_with_its_default():
    params, rows = _parameters(), _table()
    assert rows, "the table of docs/getting-started.md was not found"
    problems = []
    for word in sorted({w for w, *_ in rows}):
        mine = [r for r in rows if r[0] == word]
        listed = [h for r in mine for h in r[3]]
        taken = params.get(word, {})
        if sorted(listed) != sorted(taken) or len(set(listed)) != len(listed):
            problems.append(f"`{word}`: the table lists {sorted(set(listed) ^ set(taken))} wrongly (taken by: {', '.join(sorted(taken))})")
            continue
        for _, spec, rest, helpers in mine:
            assert set(spec) <= set(helpers), f"`{word}`: a default for a helper not in its row: {set(spec) - set(helpers)}"
            for h in helpers:
                want = spec.get(h, rest)
                if not _same(taken[h], want):
                    problems.append(f"`{word}` in {h}: default {taken[h]!r}, the table says {want!r}")
    assert problems == []


@pytest.mark.parametrize("old", sorted(RETIRED))
def test_a_retired_word_is_no_parameter(old):
    """One name per concept: the retired spellings are gone from every public signature (but where the
    table keeps the word for another concept), and each helper that had one accepts it
    (``__renamed__``), mapped to the new word."""
    params, other_meaning = _parameters(), {h for w, _, _, helpers in _table() if w == old for h in helpers}
    left = set(params.get(old, {})) - other_meaning  # a row of the table: the word kept for another concept
    assert left == set(), f"{old!r} is still a parameter of {sorted(left)}"
    for helper, fn in _helpers():
        moved = getattr(fn, "__renamed__", {})
        if old in moved:
            params = inspect.signature(fn).parameters
            takes_options = any(p.kind is p.VAR_KEYWORD for p in params.values())  # scale's: passed to the helper
            assert moved[old] == RETIRED[old] and (RETIRED[old] in params or takes_options), helper


def test_renamed_keeps_the_old_keyword_and_the_position():
    @renamed(top_k="k")
    def f(x, k=5, *, y=0):
        return x, k, y

    with pytest.warns(DeprecationWarning, match="rs_interp: f\\(\\): the keyword 'top_k' is deprecated .*use 'k'"):
        assert f(1, top_k=3) == (1, 3, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1, 2, y=4) == (1, 2, 4) and f(1, k=2) == (1, 2, 0)  # positions unchanged, no warning
    with pytest.raises(TypeError, match="both 'top_k'"):
        f(1, top_k=3, k=2)
    assert list(inspect.signature(f).parameters) == ["x", "k", "y"] and f.__renamed__ == {"top_k": "k"}


def test_renamed_attribute():
    class R:
        k = 3
        top_k = renamed_attribute("top_k", "k")

    with pytest.warns(DeprecationWarning, match="R.top_k is deprecated .*use R.k"):
        assert R().top_k == 3


def test_old_keywords_give_the_same_numbers(toy2, small_batch):
    """The notebooks' spellings still run, warn, and mean what they meant."""
    toks = small_batch.tokens[:4, :20]
    loss = ri.next_token_loss(ri.next_token_targets(toks))
    with pytest.warns(DeprecationWarning, match="'method' is deprecated.*'ablation'"):
        old = ri.head_ablation_scan(toy2, toks, loss, method="mean", progress=False)
    new = ri.head_ablation_scan(toy2, toks, loss, ablation="mean", progress=False)
    assert torch.equal(old.effect, new.effect) and new.ablation == "mean"
    with pytest.warns(DeprecationWarning, match="HeadAblationScan.method"):
        assert new.method == "mean"
    with pytest.warns(DeprecationWarning, match="'top_k' is deprecated.*'k'"):
        assert torch.equal(ri.logit_lens(toy2, toks, top_k=3).top_tokens, ri.logit_lens(toy2, toks, k=3).top_tokens)
    with pytest.warns(DeprecationWarning, match="'kind' is deprecated.*'which'"):
        old = ri.composition_scores(toy2, kind="k")
    assert _equal(old.scores, ri.composition_scores(toy2, "k").scores)
    with pytest.warns(DeprecationWarning, match="CompositionScores.kind"):
        assert ri.composition_scores(toy2, which="q").kind == "q"


def _equal(a, b) -> bool:
    """Bit for bit, NaN where NaN (float fields of results)."""
    if isinstance(a, torch.Tensor):
        if not a.is_floating_point():
            return torch.equal(a, b)
        return a.shape == b.shape and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    return a == b or (a != a and b != b)


def _fields(result) -> dict:
    return {k: v for k, v in vars(result).items() if isinstance(v, (torch.Tensor, float))}


def test_the_memory_budget_only_tiles(toy2, small_batch):
    """A budget of one byte (one sequence, one head, one edge, one source per tile) and the default give
    the same floats, bit for bit, on this float32 toy model, so the one default changed no number (the
    logit lens and the second-order attribution moved to it). On GPT-2's shape exact path patching's
    stacked passes differ in the last bits (rs_interp._budget): its default did not move."""
    toks, ref = small_batch.tokens[:5, :24], small_batch.tokens[5:10, :24]
    targets = ri.next_token_targets(toks)
    metric = lambda logits: logits[:, -1].log_softmax(-1)[torch.arange(len(toks)), toks[:, 0]].mean()  # noqa: E731
    edges = ri.edge_layout(toy2).edges()
    runs = {
        "logit_lens": lambda b: ri.logit_lens(toy2, toks, targets=targets, memory_budget=b),
        "second_order_attribution": lambda b: ri.second_order_attribution(toy2, toks, targets=targets, memory_budget=b),
        "head_ablation_scan": lambda b: ri.head_ablation_scan(toy2, toks, metric, memory_budget=b, progress=False),
        "path_patching": lambda b: ri.path_patching(toy2, toks, metric, reference=ref, edges=edges[:12], memory_budget=b, progress=False),
        "edge_attribution_patching": lambda b: ri.edge_attribution_patching(toy2, toks, metric, reference=ref, qk_fix=True,
                                                                            memory_budget=b, progress=False),
    }
    for name, run in runs.items():
        big, small = _fields(run(MEMORY_BUDGET)), _fields(run(1))
        assert big and big.keys() == small.keys(), name
        assert all(_equal(big[k], small[k]) for k in big), f"{name}: {[k for k in big if not _equal(big[k], small[k])]}"


#: A renamed helper called with its old keyword, on one line (the repo's own uses: none left).
OLD_CALLS = [
    r"(ablate_heads|head_ablation_scan|evaluate_circuit|faithfulness_curve|mib_scores|acdc)\([^#]*\bmethod=",
    r"logit_lens\([^#]*\btop_k=", r"attribution_patching\([^#]*\bnodes=", r"(composition_scores|virtual_weight)\([^#]*\bkind=",
    r"qk_attributions\([^#]*\btop=", r"qk_attributions\([^#]*\bedges=", r"estimate_graph\([^#]*\bn_logits=", r"top_edges\([^#]*\bn=",
    r"\bevaluate\([^#]*\bchunk_size=", r"\bscan\.method\b", r"\bacdc\([^#]*\)\.method\b",
]


def test_the_repo_uses_the_new_words():
    files = [p for d in ("rs_interp", "tests", "docs", "notebooks", "benchmarks") for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".md", ".ipynb") and p != Path(__file__).resolve()] + [ROOT / "README.md"]
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:120]}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if any(re.search(r, line) for r in OLD_CALLS)]
    assert hits == []


def test_qk_attributions_takes_attention_edges_and_the_old_keyword_warns():
    """``edges`` means (sender, receiver) pairs everywhere; an attention edge (layer, head, query, key) is
    ``attention_edges``: the old keyword gives the same table, with a warning."""
    from rs_interp.features import attribution_graph, qk_attributions, shipped_transcoders

    model, tcs = ri.load_toy_model("code-2l"), shipped_transcoders("code-2l")
    g = attribution_graph(model, tcs, torch.arange(100, 108), targets=[108], progress=False)
    (new,) = qk_attributions(model, tcs, g, attention_edges=[(1, 0, 7, 3)])
    with pytest.warns(DeprecationWarning, match="'edges' is deprecated.*'attention_edges'"):
        (old,) = qk_attributions(model, tcs, g, edges=[(1, 0, 7, 3)])
    assert torch.equal(new.table, old.table) and new.score == old.score

