"""The task datasets: every pair as long in tokens under GPT-2's tokenizer, every name, object and year
one token, the answers what the text says they are, the metric against a loop written out, the same
seed the same bytes in another process, the refusals, and EAP-IG's CSV round-tripped (MIB's graph files:
tests/circuits/test_mib_files.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import rs_interp as ri
from rs_interp._messages import LIMIT
from rs_interp.tasks import (
    Task,
    build_task,
    greater_than_task,
    induction_task,
    ioi_task,
    read_eap_csv,
    sva_task,
    write_eap_csv,
)
from rs_interp.tasks import greater_than as gt_module
from rs_interp.tasks import ioi as ioi_module
from rs_interp.tasks import sva as sva_module
from rs_interp.tokenizers import gpt2_tokenizer

TEXT_TASKS = {"ioi": ioi_task, "greater-than": greater_than_task, "sva": sva_task}
N = 48


@pytest.fixture(scope="module")
def tok():
    return gpt2_tokenizer()


@pytest.fixture(scope="module")
def tasks(tok):
    return {name: build(tok, N, seed=3) for name, build in TEXT_TASKS.items()}


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", TEXT_TASKS)
def test_every_pair_is_as_long_in_tokens(tok, tasks, name):
    task = tasks[name]
    assert len(task) == N
    for i, (c, x) in enumerate(zip(task.prompts, task.corrupted_prompts)):
        tc, tx = _ids(tok, c), _ids(tok, x)
        assert len(tc) == len(tx), (c, x)
        assert c != x
        assert task.clean[i, : len(tc) + 1].tolist() == [50256] + tc  # BOS, then the prompt
        assert task.corrupted[i, : len(tx) + 1].tolist() == [50256] + tx
        assert int(task.positions[i]) == len(tc)  # the prompt's last token


def _span(task, row, name):
    """The token ids of one span of one row."""
    where = task.spans.span_of[row] == task.spans.index(name)
    return task.clean[row][where].tolist()


def test_the_spans_align_the_prompts_roles(tok, tasks):
    """Issue 66: each task's position schema puts every row's words in their span, whatever the row's length:
    IOI's names (IO and S in the first clause, S2), greater-than's years, SVA's subject; the last span is the padding,
    and every row's read position (``positions``) is its last non-padding token."""
    ioi, gt, sva = tasks["ioi"], tasks["greater-than"], tasks["sva"]
    for task in (ioi, gt, sva):
        assert task.spans.names[-1] == "pad" and tuple(task.spans.span_of.shape) == tuple(task.clean.shape)
        last = task.spans.span_of[torch.arange(len(task)), task.positions]
        assert bool((last != task.spans.n_spans - 1).all())
        assert bool((task.spans.span_of.gather(1, (task.positions + 1).clamp(max=task.clean.shape[1] - 1)[:, None])[:, 0]
                     == task.spans.n_spans - 1)[task.positions + 1 < task.clean.shape[1]].all())
    for b in range(len(ioi)):
        io, s = int(ioi.answers[b, 0]), int(ioi.wrong[b, 0])
        assert sorted(_span(ioi, b, "first name") + _span(ioi, b, "second name")) == sorted([io, s])
        assert _span(ioi, b, "S2") == [s] and _span(ioi, b, "and") == _ids(tok, " and") and _span(ioi, b, "end") == _ids(tok, " to")
    lengths = {int(p) for p in ioi.positions}
    assert len(lengths) > 1  # prompts of several lengths, aligned by their spans
    for b in range(len(gt)):
        assert tok.decode(_span(gt, b, "YY")) == f"{int(gt.label[b]):02d}" and _span(gt, b, "XX1") == _span(gt, b, "XX2")
    for b in range(len(sva)):
        assert tok.decode(_span(sva, b, "subject")).strip() in {w for pair in sva_module.SUBJECTS for w in pair}


def test_ioi_words_are_single_tokens(tok):
    for words in (ioi_module.NAMES, ioi_module.PLACES, ioi_module.OBJECTS):
        assert all(len(_ids(tok, " " + w)) == 1 for w in words)


def test_ioi_answers_are_the_indirect_object_and_the_subject(tok, tasks):
    """From the text alone: the name said once is the IO (the answer), the name said twice is S; the
    ABC corruption names three others; both orders occur."""
    task, names = tasks["ioi"], set(ioi_module.NAMES)
    orders = set()
    for i, (c, x) in enumerate(zip(task.prompts, task.corrupted_prompts)):
        said = [w for w in re.findall(r"[A-Z][a-z]+", c) if w in names]
        io = next(w for w in said if said.count(w) == 1)
        s = next(w for w in said if said.count(w) == 2)
        assert len(said) == 3 and tok.decode(task.answers[i]) == " " + io and tok.decode(task.wrong[i]) == " " + s
        orders.add("ABBA" if said[0] == io else "BABA")
        others = [w for w in re.findall(r"[A-Z][a-z]+", x) if w in names]
        assert len(others) == 3 and len(set(others)) == 3 and not set(others) & {io, s}
        assert re.sub("|".join(said + others), "_", c) == re.sub("|".join(said + others), "_", x)  # only the names differ
    assert orders == {"ABBA", "BABA"}


def test_greater_than_years_and_answers(tok, tasks):
    task = tasks["greater-than"]
    digits = [_ids(tok, f"{k:02d}") for k in range(100)]
    assert all(len(d) == 1 for d in digits)
    assert all(len(_ids(tok, " " + n)) == 1 for n in gt_module.NOUNS)
    for year in gt_module.valid_years(tok):  # ACDC's filter: " YYyy" is " YY" + "yy"
        assert _ids(tok, f" {year}") == _ids(tok, f" {year // 100}") + _ids(tok, f"{year % 100:02d}")
    for i, (c, x) in enumerate(zip(task.prompts, task.corrupted_prompts)):
        m = re.fullmatch(r"The (\w+) lasted from the year (\d\d)(\d\d) to (\d\d)", c)
        assert m and m.group(2) == m.group(4) and int(m.group(3)) == int(task.label[i])
        assert x == c.replace(f"year {m.group(2)}{m.group(3)}", f"year {m.group(2)}01")
        yy = int(m.group(3))
        assert [tok.decode(t) for t in task.answers[i] if t >= 0] == [f"{k:02d}" for k in range(yy + 1, 100)]
        assert [tok.decode(t) for t in task.wrong[i] if t >= 0] == [f"{k:02d}" for k in range(yy + 1)]


def test_sva_answers_agree_with_the_clean_subject(tok, tasks):
    task = tasks["sva"]
    plural_nouns = {p for _, p in sva_module.SUBJECTS}
    for i, (c, x) in enumerate(zip(task.prompts, task.corrupted_prompts)):
        subject, other = c.split()[1], x.split()[1]
        assert (subject in plural_nouns) == bool(task.label[i]) != (other in plural_nouns)
        assert c.split()[2:] == x.split()[2:]
        forms = [tok.decode(t).strip() for t in task.answers[i] if t >= 0]
        assert forms == [v[int(task.label[i])] for v in sva_module.VERBS]


def test_sva_keeps_only_pairs_of_equal_length(tok):
    """'painter' is one GPT-2 token and 'painters' two: with it as the only subject no pair survives."""
    with pytest.raises(ValueError, match="as long in tokens"):
        sva_task(tok, 2, subjects=[("painter", "painters")])
    assert len(sva_task(tok, 2, subjects=[("skater", "skaters")])) == 2  # two tokens each: kept


def _scores_by_hand(task, logits, kind):
    out = []
    for b in range(len(task)):
        row = logits[b, int(task.positions[b])].double()
        values = row.softmax(-1) if kind == "prob_diff" else row
        good = [float(values[t]) for t in task.answers[b] if t >= 0]
        bad = [float(values[t]) for t in task.wrong[b] if t >= 0]
        agg = sum if kind == "prob_diff" else (lambda v: sum(v) / len(v))
        out.append(agg(good) - agg(bad))
    return out


@pytest.mark.parametrize("name", list(TEXT_TASKS) + ["induction"])
@pytest.mark.parametrize("kind", ["logit_diff", "prob_diff"])
def test_metric_against_a_loop(tok, name, kind):
    task = build_task(name, tok, n=5, seed=4)
    vocab = 50257 if name in TEXT_TASKS else 256
    logits = torch.randn(len(task), task.clean.shape[1], vocab, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = _scores_by_hand(task, logits, kind)
    got = task.scores(logits, kind)
    assert got.dtype == torch.float64 and torch.allclose(got, torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=0)
    assert float(task.metric(kind)(logits)) == pytest.approx(sum(want) / len(want), abs=1e-12)


def test_metric_is_differentiable_and_checks_shapes(tok):
    task = ioi_task(tok, 3, seed=0)
    logits = torch.zeros(len(task), task.clean.shape[1], 50257, requires_grad=True)
    task.metric()(logits).backward()
    assert logits.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="do not match"):
        task.metric()(torch.zeros(len(task), task.clean.shape[1] + 1, 50257))
    with pytest.raises(ValueError, match="outside the model's 100 logits"):
        task.metric()(torch.zeros(len(task), task.clean.shape[1], 100))


def test_induction_answers_come_from_the_repeat():
    task = induction_task(N, seed=5, seq_len=20, min_period=3, max_period=9)
    for b in range(N):
        p, row = int(task.label[b]), task.clean[b].tolist()
        assert all(row[i] == row[i - p] for i in range(p, 20))
        assert int(task.answers[b, 0]) == row[20 - p] != int(task.wrong[b, 0])
    model = ri.load_toy_model("induction-2l")
    with torch.no_grad():  # a trained induction model prefers the clean repeat on the clean rows
        assert float(task.metric()(model(task.clean))) > 1 > -1 > float(task.metric()(model(task.corrupted)))


_DIGESTS = """
import json, sys
from rs_interp.tokenizers import gpt2_tokenizer
from rs_interp.tasks import build_task
tok = gpt2_tokenizer()
print(json.dumps({name: build_task(name, tok, n=24, seed=11).digest() for name in ("ioi", "greater-than", "sva", "induction")}))
"""


@pytest.fixture(scope="module", autouse=True)
def other_process():
    """The other process starts with the module's first test and runs beside the rest (it spends most
    of its time importing); test_same_seed_same_bytes_in_another_process, last, reads its answer."""
    proc = subprocess.Popen([sys.executable, "-c", _DIGESTS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1"})
    yield proc
    proc.kill()
    proc.communicate()


@pytest.mark.parametrize("name", ["ioi", "greater-than", "sva"])
def test_refuses_a_tokenizer_whose_words_are_not_single_tokens(name):
    code_tok = ri.models.SHIPPED_MODELS["code-2l"].tokenizer()  # a 2,048-token BPE of Python sources
    with pytest.raises(ValueError, match=r"of \d+ \w[\w -]* are not single tokens under this tokenizer: '"):
        build_task(name, code_tok, n=2)


def test_refusals_name_the_words(tok):
    with pytest.raises(ValueError, match=r"1 of 6 names .* ' Bartholomew' -> \d tokens. Pass names= a list") as err:
        ioi_task(tok, 2, names=["Mary", "John", "Tom", "James", "Anna", "Bartholomew"])
    assert isinstance(err.value, ri.tasks.NotSingleTokens) and list(err.value.words) == [" Bartholomew"]
    code_tok = ri.models.SHIPPED_MODELS["code-2l"].tokenizer()
    with pytest.raises(ri.tasks.NotSingleTokens) as every:  # issue 61 item 4: 99 names, a few shown, all in .words
        ioi_task(code_tok, 2)
    message = str(every.value)
    assert len(every.value.words) == 99 and "and 96 more" in message and len(message) <= LIMIT, message
    assert message.endswith("this error's .words holds them all.")
    with pytest.raises(ValueError, match="at least 5 distinct names"):
        ioi_task(tok, 2, names=["Mary", "John", "Tom", "Anna"])
    with pytest.raises(ValueError, match="unknown task 'docstring'"):
        build_task("docstring", tok)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        build_task("ioi", None)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        greater_than_task(tok, 0)


def test_task_checks_its_fields():
    ok = dict(clean=torch.tensor([[1, 2]]), corrupted=torch.tensor([[1, 3]]), answers=torch.tensor([[4]]),
              wrong=torch.tensor([[5]]), positions=torch.tensor([1]))
    Task("t", **ok)
    for change, message in [(dict(corrupted=torch.tensor([[1, 3, 3]])), "as long"), (dict(positions=torch.tensor([2])), r"\[0, 2\)"),
                            (dict(answers=torch.tensor([[-1]])), "empty in rows"), (dict(wrong=torch.tensor([[-2]])), "negative ids"),
                            (dict(clean=torch.tensor([[1.0, 2.0]])), "torch.long"), (dict(kind="kl"), "kind")]:
        with pytest.raises(ValueError, match=message):
            Task("t", **{**ok, **change})


# --- EAP-IG's CSV -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TEXT_TASKS)
def test_eap_csv_round_trip(tok, tasks, tmp_path, name):
    task = tasks[name]
    path = write_eap_csv(task, tmp_path / f"{name}.csv")
    header = path.read_text().splitlines()[0]
    assert header == {"ioi": "clean,corrupted,correct_idx,incorrect_idx", "greater-than": "clean,corrupted,label",
                      "sva": "clean,corrupted,plural"}[name]
    back = read_eap_csv(path, name, tok)
    assert back.digest() == task.digest() and back.prompts == task.prompts and back.seed is None


def test_eap_csv_reads_eap_igs_own_layout(tok, tmp_path):
    """pandas' index column and extra columns (EAP-IG's ioi files) are ignored; eap-ig-faithfulness's
    greater-than column is named correct_idx."""
    path = tmp_path / "ioi.csv"
    path.write_text(',clean,corrupted,corrupted_hard,correct_idx,incorrect_idx\n'
                    '826,"When Amy and Laura got a snack at the house, Laura decided to give it to",'
                    '"When Amy and Laura got a snack at the house, Nicholas decided to give it to",'
                    '"When Amy and Laura got a snack at the house, Amy decided to give it to",14235,16753\n')
    task = read_eap_csv(path, "ioi", tok)
    assert tok.decode(task.answers[0]) == " Amy" and tok.decode(task.wrong[0]) == " Laura"
    gt = tmp_path / "gt.csv"
    gt.write_text("clean,corrupted,correct_idx\nThe plan lasted from the year 1642 to the year 16,The plan lasted from the year 1601 to the year 16,42\n")
    assert int(read_eap_csv(gt, "greater-than", tok).label[0]) == 42
    with pytest.raises(ValueError, match="no column plural"):
        read_eap_csv(gt, "sva", tok)


def test_eap_csv_refuses_induction(tmp_path):
    with pytest.raises(ValueError, match="no texts"):
        write_eap_csv(induction_task(2), tmp_path / "x.csv")


def test_same_seed_same_bytes_in_another_process(tok, other_process):
    mine = {name: build_task(name, tok, n=24, seed=11).digest() for name in ("ioi", "greater-than", "sva", "induction")}
    assert mine == {name: build_task(name, tok, n=24, seed=11).digest() for name in mine}
    assert all(build_task(name, tok, n=24, seed=12).digest() != d for name, d in mine.items())
    out, err = other_process.communicate(timeout=300)
    assert other_process.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1]) == mine


@pytest.mark.parametrize("name", ["MIBGraph", "write_mib", "read_mib", "write_mib_circuits", "mib_edge_names",
                                  "from_mib_edge", "mib_importances"])
def test_mib_names_answer_here_for_a_release(name):
    """MIB's graph files moved beside the circuits (rs_interp.circuits): the old name gives the same object, with a
    DeprecationWarning naming the new place, and is no longer listed."""
    import rs_interp.tasks as T

    with pytest.warns(DeprecationWarning, match=f"rs_interp.tasks.{name} is now rs_interp.circuits.{name}"):
        assert getattr(T, name) is getattr(ri.circuits, name)
    assert name not in T.__all__ and name not in dir(T)
