"""Issue 61 item 2: your own task from your own text. ``prompt_task``'s tensors against a tokenisation by
hand (another object and path than the constructor's: the tokenizer's own call with its BOS, the
vocabulary's byte-level spellings), its metric against a loop, and its refusals, each naming the pair and
the word, within the length of a message (400 characters, whole sentences)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import rs_interp as ri
from rs_interp.models import SHIPPED_MODELS
from rs_interp.tasks import one_token_words, prompt_task, word_pieces
from rs_interp.tokenizers import gpt2_tokenizer

IOI = [("When Mary and John went to the store, John gave a drink to",
        "When Mary and John went to the store, Mary gave a drink to"),
       ("Then, Sarah and Paul had fun. Paul said to", "Then, Sarah and Paul had fun. Sarah said to")]
CODE = "        x = self.plonk_{}(x)\n        x = self.plonk_"


@pytest.fixture(scope="module")
def tok():
    return gpt2_tokenizer()


@pytest.fixture(scope="module")
def code2l():
    return ri.load_toy_model("code-2l")


def _message(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert len(text) <= 400 and text.endswith("."), text  # sized for its reader, whole sentences
    return text


def test_gpt2_tensors_against_hand_tokenisation(tok):
    task = prompt_task(tok, IOI, [(" Mary", " John"), (" Sarah", [" Paul", " Tom"])])
    rows = [tok(c).input_ids for c, _ in IOI]  # the tokenizer's own call: BOS first (TransformerLens's set-up)
    assert rows[0][0] == tok.bos_token_id == 50256 and len(rows[0]) != len(rows[1])
    width = max(map(len, rows))
    for i, (clean, corrupted) in enumerate(IOI):
        assert task.clean[i, : len(rows[i])].tolist() == rows[i]
        assert task.corrupted[i, : len(rows[i])].tolist() == tok(corrupted).input_ids
        assert int(task.positions[i]) == len(rows[i]) - 1
    assert task.clean.shape == (2, width) and task.kind == "logit_diff" and task.seed is None
    spelled = tok.convert_tokens_to_ids  # the vocabulary's byte-level spellings: a leading space is "Ġ"
    assert task.answers.tolist() == [[spelled("ĠMary")], [spelled("ĠSarah")]]
    assert task.wrong.tolist() == [[spelled("ĠJohn"), -1], [spelled("ĠPaul"), spelled("ĠTom")]]
    assert task.prompts == tuple(c for c, _ in IOI) and task.corrupted_prompts == tuple(x for _, x in IOI)
    logits = torch.randn(2, width, 50257, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = [logits[0, task.positions[0], task.answers[0, 0]] - logits[0, task.positions[0], task.wrong[0, 0]],
            logits[1, task.positions[1], task.answers[1, 0]] - logits[1, task.positions[1], task.wrong[1]].mean()]
    assert abs(float(task.metric()(logits)) - float(sum(want) / 2)) < 1e-12


def test_code2l_tensors_against_hand_tokenisation(code2l):
    words = ["norm", "weight", "bias"]
    pairs = [(CODE.format(a), CODE.format(b)) for a in words for b in words if a != b]
    task = prompt_task(code2l, pairs, [(a, b) for a in words for b in words if a != b], kind="prob_diff", name="plonk")
    shipped = SHIPPED_MODELS["code-2l"].tokenizer()  # the shipped tokenizers.Tokenizer, not the model's wrapper
    bos = shipped.token_to_id("<|endoftext|>")
    for i, (clean, corrupted) in enumerate(pairs):
        assert task.clean[i].tolist() == [bos] + shipped.encode(clean).ids
        assert task.corrupted[i].tolist() == [bos] + shipped.encode(corrupted).ids
    for i, (a, b) in enumerate((a, b) for a in words for b in words if a != b):  # each answer: the prompt's next token
        assert shipped.encode(pairs[i][0] + a).ids == shipped.encode(pairs[i][0]).ids + [int(task.answers[i, 0])]
        assert task.answers[i].tolist() == [shipped.token_to_id(a)]
        assert task.wrong[i].tolist() == [shipped.token_to_id(b)]
    assert task.name == "plonk" and task.kind == "prob_diff" and len(task) == 6
    with torch.no_grad():  # the induction the prompts ask for: the clean prompts prefer their own word
        assert float(task.metric()(code2l(task.clean))) > 0 > float(task.metric()(code2l(task.corrupted)))


def test_refuses_a_multi_token_answer_naming_the_pair_the_word_and_its_pieces(code2l, tok):
    pairs = [("x = 1", "x = 2"), ("    return self.", "    return cls.")]
    with pytest.raises(ValueError) as err:
        prompt_task(code2l, pairs, [("norm", "bias"), ("weight", "Mary")])
    text = _message(err)
    assert text.startswith("Pair 1 ('    return self.'): the wrong answer 'Mary' is 2 tokens, 'M' + 'ary'")
    assert "rs_interp.tasks.one_token_words" in text
    with pytest.raises(ValueError) as err:  # a one-token spelling nearby is named
        prompt_task(tok, IOI[:1], [(" Maryy", " John")])
    assert "Pair 0 ('When Mary and John went to the store, John ga...')" in _message(err)
    assert "' Maryy' is 2 tokens" in str(err.value) and "' Mary' is one token" in str(err.value)


def test_refuses_pairs_of_unequal_length_naming_the_words(tok):
    pairs = [IOI[0], ("When Mary and John went", "When Mary and Xyzzy went")]
    with pytest.raises(ValueError) as err:
        prompt_task(tok, pairs, [(" Mary", " John")] * 2)
    text = _message(err)
    assert text.startswith("Pair 1 ('When Mary and John went'): the clean prompt is 5 tokens and the corrupted 7")
    assert text.endswith("the clean prompt has ' John' (1 token) and the corrupted ' X' + 'y' + 'zzy' (3 tokens).")


@pytest.mark.parametrize("answers, says", [
    ([(" John", [" Mary", " John"])], "Pair 0: ' John' is both a correct and a wrong answer"),
    ([(" Mary", " John")] * 2, "answers must hold one (correct, wrong) per pair: 1 pairs, 2 answers"),
    ([(" Mary",)], "The answers of pair 0 must be (correct, wrong)"),
    ([(" Mary", [])], "The wrong answer of pair 0 must be a non-empty string or a list of them"),
])
def test_refuses_malformed_answers(tok, answers, says):
    with pytest.raises(ValueError) as err:
        prompt_task(tok, IOI[:1], answers)
    assert _message(err).startswith(says)


def test_refuses_an_answer_that_is_not_its_own_token_after_the_prompt(tok):
    with pytest.raises(ValueError) as err:
        prompt_task(tok, [("The answer is ", "The answer was ")], [("5", "6")])
    assert _message(err).startswith("Pair 0 ('The answer is '): written after its prompt, the correct answer '5' "
                                    "is not its own token: the text ends ' 5' (1 token)")
    assert "end the prompt before its last space" in str(err.value)


def test_checks_a_model_s_vocabulary_and_context(tok):
    # a model carrying a foreign tokenizer
    small = SimpleNamespace(cfg=SimpleNamespace(d_vocab=1000, n_ctx=64), tokenizer=tok)
    with pytest.raises(ValueError) as err:
        prompt_task(small, IOI[:1], [(" Mary", " John")])
    assert "outside the model's 1000-token vocabulary" in _message(err)
    short = SimpleNamespace(cfg=SimpleNamespace(d_vocab=50257, n_ctx=8), tokenizer=tok)
    with pytest.raises(ValueError) as err:
        prompt_task(short, IOI[:1], [(" Mary", " John")])
    assert _message(err) == "Pair 0 is 15 tokens, more than the model's context of 8: shorten its prompts."


def test_which_words_are_one_token(tok, code2l):
    pieces = {" self": (" self",), " Mary": (" M", "ary"), "norm": ("norm",)}
    assert word_pieces(code2l, list(pieces)) == pieces
    shipped = SHIPPED_MODELS["code-2l"].tokenizer()
    for prefix in (" ", ""):
        words = one_token_words(code2l, prefix=prefix)
        assert len(words) > 300 and len(set(words)) == len(words)
        def word(w: str) -> bool:
            return w.startswith(prefix) and w[len(prefix):].isidentifier() and w[len(prefix):].isascii()

        assert all(len(shipped.encode(w).ids) == 1 and word(w) for w in words)
        every = [shipped.decode([i]) for i in range(shipped.get_vocab_size())]  # the vocabulary by hand
        assert set(words) == {w for w in every if word(w) and len(shipped.encode(w).ids) == 1}
    assert " self" in one_token_words(code2l) and " Mary" not in one_token_words(code2l)
    assert {" Mary", " John", " Kristen"} <= set(one_token_words(tok))
    with pytest.raises(ValueError, match="words must be a list of strings"):
        word_pieces(tok, " Mary")
