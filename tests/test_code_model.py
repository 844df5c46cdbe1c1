"""Issue 17 (open): the corpus, tokenizer and training code of code-2l; no model is shipped yet."""

import pytest
import torch

import rs_interp as ri
from rs_interp.code_model import (
    CODE_VOCAB,
    EOT,
    _windows,
    code_corpus,
    encode_corpus,
    repeated_sequence_losses,
    train_code_tokenizer,
    unigram_loss,
)

#: sha256 of the corpus read from torch 2.13.0's sources (what scripts/setup_env.sh installs).
TORCH_2_13_SHA256 = "9043cfe89fa534fc"


@pytest.fixture(scope="module")
def corpus():
    return code_corpus()


def test_corpus_is_fixed_by_the_pinned_torch(corpus):
    if not corpus.torch_version.startswith("2.13.0"):
        pytest.skip(f"the corpus hash is recorded for torch 2.13.0; this environment has {corpus.torch_version}")
    assert corpus.sha256.startswith(TORCH_2_13_SHA256)
    assert code_corpus().sha256 == corpus.sha256  # read in a fixed order
    assert not set(corpus.paths[0]) & set(corpus.paths[1]) and len(corpus.heldout) >= 5


def test_tokenizer_round_trips_code(corpus):
    tok = train_code_tokenizer(corpus)
    text = "    def forward(self, input: Tensor) -> Tensor:\n        return F.linear(input, self.weight, self.bias)\n"
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.get_vocab_size() == CODE_VOCAB and tok.token_to_id(EOT) is not None
    stream = encode_corpus(tok, corpus.heldout[:2])
    assert int((stream == tok.token_to_id(EOT)).sum()) == 2


def test_unigram_loss_is_the_entropy_of_a_uniform_stream():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 64, (200_000,), generator=g), torch.randint(0, 64, (20_000,), generator=g)
    assert unigram_loss(a, b, 64) == pytest.approx(torch.log(torch.tensor(64.0)).item(), abs=0.01)


def _repeated_span(row):
    """(start, length) of a span followed at once by a copy of itself, the longest such span."""
    n = len(row)
    best = None
    for length in range(n // 2, 0, -1):
        for at in range(n - 2 * length + 1):
            if torch.equal(row[at : at + length], row[at + length : at + 2 * length]):
                return at, length
    return best


def test_curriculum_windows():
    """A stream that never repeats: the last half of the batch holds a span written twice in a row, of
    varying length and place; the last quarter's spans are random tokens; the rest are real windows."""
    stream = torch.arange(100_000) + 1000
    w = _windows(stream, 16, 64, torch.Generator().manual_seed(0), repeat_fraction=0.5, random_fraction=0.25, d_vocab=50)
    assert bool((w[:8, 1:] - w[:8, :-1] == 1).all())
    spans = [_repeated_span(row) for row in w[8:]]
    assert all(s is not None and 8 <= s[1] <= 32 for s in spans)
    assert len({s for s in spans}) > 1  # not one fixed offset: no positional shortcut
    assert all(bool((row[at : at + n] < 50).all()) for row, (at, n) in zip(w[12:], spans[4:]))


def test_repeated_sequence_losses_reward_a_copier():
    """A model with no induction pays the same on the repeat; the helper is the measure the issue asks for."""
    model = ri.make_attn_only(2, seed=1)
    first, repeat = repeated_sequence_losses(model, n=8, half=20)
    assert abs(first - repeat) < 0.5
    toy = ri.load_toy_model("induction-2l")
    first, repeat = repeated_sequence_losses(toy, n=32, half=20)
    assert first - repeat >= 2.0
