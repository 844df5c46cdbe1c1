"""Issue 17: code-2l, a GPT-2-architecture model trained here on the Python sources of the pinned torch."""

import json

import pytest
import torch

import rs_interp as ri
from rs_interp.code_model import (
    CODE_TRAINING,
    EOT,
    code_corpus,
    encode_corpus,
    load_code_tokenizer,
    repeated_sequence_losses,
    train_code_model,
    unigram_loss,
)
from rs_interp.models import read_metadata, toy_model_path

META = read_metadata(toy_model_path("code-2l"))


@pytest.fixture(scope="module")
def code2l():
    return ri.load_toy_model("code-2l")


@pytest.fixture(scope="module")
def corpus():
    return code_corpus()


def test_corpus_is_the_recorded_one(corpus):
    if corpus.torch_version != META["corpus"]["torch"]:
        pytest.skip(f"the corpus is torch {META['corpus']['torch']}'s sources; this environment has torch {corpus.torch_version} "
                    "(scripts/setup_env.sh installs torch==2.13.0)")
    assert corpus.sha256 == META["corpus"]["sha256"]
    assert [len(corpus.train), len(corpus.heldout)] == META["corpus"]["files"]
    assert not set(corpus.paths[0]) & set(corpus.paths[1]) and len(corpus.heldout) >= 5


def test_tokenizer_round_trips_code():
    tok = load_code_tokenizer()
    text = "    def forward(self, input: Tensor) -> Tensor:\n        return F.linear(input, self.weight, self.bias)\n"
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.get_vocab_size() == ri.load_toy_model("code-2l").cfg.d_vocab and tok.token_to_id(EOT) is not None


def test_architecture_is_gpt2s(code2l):
    cfg = code2l.cfg
    assert (cfg.normalization_type, cfg.act_fn, cfg.positional_embedding_type, cfg.attn_only) == ("LN", "gelu_new", "standard", False)


def test_unigram_loss_is_the_entropy_of_a_uniform_stream():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, 64, (200_000,), generator=g), torch.randint(0, 64, (20_000,), generator=g)
    assert unigram_loss(a, b, 64) == pytest.approx(torch.log(torch.tensor(64.0)).item(), abs=0.01)


def test_heldout_loss_beats_the_unigram_baseline():
    assert META["heldout_loss"] <= META["unigram_loss"] - 1.0


def test_the_loss_falls_on_the_repeat(code2l):
    """Fresh repeated random sequences: at least 2 nats lower on the second occurrence."""
    first, repeat = repeated_sequence_losses(code2l, n=64, half=50, seed=123)
    assert first - repeat >= 2.0


def test_a_previous_token_head_and_an_induction_head(code2l):
    from rs_interp.reproduce.sections.code_model import _repeat_batch

    rb = _repeat_batch(code2l, 64, 50, seed=7)
    prev = ri.prev_token_scores(code2l, rb.tokens)
    assert float(prev[0].max()) >= 0.4
    loss = lambda lg: torch.nn.functional.cross_entropy(lg[:, :-1][rb.scored], rb.tokens[:, 1:][rb.scored])  # noqa: E731
    scan = ri.head_ablation_scan(code2l, rb.tokens, loss, method="mean")
    assert float(scan.effect[1].max()) >= 0.5  # ablating one later head costs the repeat at least half a nat


@pytest.mark.slow
def test_retraining_reproduces_the_shipped_metrics():
    """Retrain from the recorded seed with the shipped tokenizer: the held-out loss within 0.02 nats
    (across processors the float32 training re-rounds, as for the induction toys) and the circuit."""
    model, _, meta = train_code_model(progress=False, tokenizer=load_code_tokenizer(), **CODE_TRAINING)
    assert meta["corpus"]["sha256"] == META["corpus"]["sha256"]
    assert abs(meta["heldout_loss"] - META["heldout_loss"]) <= 0.02
    first, repeat = repeated_sequence_losses(model, n=64, half=50, seed=123)
    assert first - repeat >= 2.0


@pytest.mark.slow
def test_retrained_tokenizer_is_the_shipped_one(corpus):
    from rs_interp.code_model import train_code_tokenizer

    fresh = json.loads(train_code_tokenizer(corpus).to_str())
    shipped = json.loads(load_code_tokenizer().to_str())
    assert fresh["model"]["vocab"] == shipped["model"]["vocab"] and fresh["model"]["merges"] == shipped["model"]["merges"]
