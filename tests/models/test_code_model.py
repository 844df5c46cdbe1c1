"""code-2l (issue 17): the corpus, the tokenizer, the training batches, the shipped model's claims, its retraining."""

import pytest
import torch

import rs_interp as ri
from rs_interp._backend import bias_parameters
from rs_interp.models.code_model import (
    CODE_VOCAB,
    EOT,
    _batch,
    code_corpus,
    encode_corpus,
    load_code_tokenizer,
    repeated_sequence_losses,
    train_code_model,
    train_code_tokenizer,
    unigram_loss,
)
from rs_interp.models.registry import SHIPPED_MODELS, toy_model_path
from rs_interp.reproduce.expected import EXPECTED
from tests.builders import slow_on_tl3

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


def test_training_batches_mix_code_and_repeated_random_sequences():
    """A stream that never repeats: the first rows are the toy task's periodic random sequences (a block
    of 6-24 tokens repeated to the end), the rest consecutive windows of the stream."""
    stream = torch.arange(100_000) + 1000
    w = _batch(stream, 16, 64, torch.Generator().manual_seed(0), periodic_fraction=0.5, d_vocab=50)
    assert w.shape == (16, 64)
    assert bool((w[8:, 1:] - w[8:, :-1] == 1).all()) and bool((w[8:] >= 1000).all())
    periods = []
    for row in w[:8]:
        assert bool((row < 50).all())
        p = next(p for p in range(1, 65) if torch.equal(row[p:], row[:-p]))
        periods.append(p)
    assert all(6 <= p <= 24 for p in periods) and len(set(periods)) > 1
    assert bool((_batch(stream, 4, 64, torch.Generator().manual_seed(0), periodic_fraction=0.0) >= 1000).all())


def test_repeated_sequence_losses_reward_a_copier():
    """A model with no induction pays the same on the repeat; the helper is the measure the issue asks for."""
    model = ri.models.make_attn_only(2, seed=1)
    first, repeat = repeated_sequence_losses(model, n=8, half=20)
    assert abs(first - repeat) < 0.5
    toy = ri.load_toy_model("induction-2l")
    first, repeat = repeated_sequence_losses(toy, n=32, half=20)
    assert first - repeat >= 2.0


@pytest.fixture(scope="module")
def code2l():
    return ri.load_toy_model("code-2l")


def test_shipped_model_is_gpt2_shaped_with_its_tokenizer(code2l):
    cfg = code2l.cfg
    assert (cfg.normalization_type, cfg.positional_embedding_type, cfg.act_fn, cfg.attn_only) == ("LN", "standard", "gelu_new", False)
    tok = load_code_tokenizer(toy_model_path("code-2l"))
    assert tok.get_vocab_size() == cfg.d_vocab == CODE_VOCAB
    meta = SHIPPED_MODELS["code-2l"].metadata()
    assert meta["training"]["seed"] == SHIPPED_MODELS["code-2l"].seed and meta["heldout_loss"] < meta["unigram_loss"] - 1.0
    # GPT-2 has no unembedding bias: kept at zero (on 4.x it is a buffer of the native head, not a parameter: nothing listed)
    assert all(float(p.abs().max()) == 0 for p in bias_parameters(code2l, ("b_U",)))


def _assert_induction_circuit(model):
    """The issue's three claims, on fresh repeated random sequences (seeds the report does not use)."""
    first, repeat = repeated_sequence_losses(model, n=64, seed=777)
    assert first - repeat >= 2.0
    g = torch.Generator().manual_seed(778)
    seq = torch.randint(0, model.cfg.d_vocab, (64, 32), generator=g)
    tokens = torch.cat([seq, seq], 1)
    assert EXPECTED["code.prev_token"].holds(float(ri.prev_token_scores(model, tokens)[0].max()))

    targets = ri.next_token_targets(tokens)
    targets[:, :32] = -1  # the loss on the repeat only
    scan = ri.head_ablation_scan(model, tokens, ri.next_token_loss(targets), ablation="mean")
    assert EXPECTED["code.single_head_ablation"].holds(float(scan.effect[1].max()))


def test_shipped_model_has_an_induction_circuit(code2l):
    _assert_induction_circuit(code2l)


#: The check on every CI run: the recipe's first 300 steps follow the shipped loss curve (recorded every
#: 50 steps). The learning rate is constant after the warm-up, so a shorter run is the full run's start.
CURVE_STEPS = 300
#: The phase-change check (``pytest -m full``): the first 2,500 steps, through the phase change (near step 1,850).
PHASE_STEPS = 2500
#: Bands measured across kernel paths (AVX2 and ATEN_CPU_CAPABILITY=default, one thread, against the
#: shipped curve, 2026-12-01): before step 1,750 the recorded losses differ by at most 0.045; the
#: phase change (first recorded loss below 4.0) came at step 1,850 (shipped), 1,850 and 1,950; the
#: mean of the last eight recorded losses differs by at most 0.04. Each band is about 3x the measurement.
CURVE_BAND, PHASE_BAND, LATE_BAND = 0.15, 200, 0.15


def _phase_change_step(curve: list[float], every: int = 50) -> int:
    return every * next(i for i, loss in enumerate(curve) if loss < 4.0)


@slow_on_tl3("300 training steps take ~1.5 minutes on one thread: in the 3.x pass, which has room for them")
def test_the_recipe_follows_the_shipped_loss_curve():
    """code-2l's recipe from the recorded seed, with the shipped tokenizer, for its first 300 steps: on the
    shipped corpus, and every recorded loss within the curve's band of the shipped one (the bands hold
    across kernel paths: see CURVE_BAND). The phase change itself is checked by ``pytest -m full``."""
    entry = SHIPPED_MODELS["code-2l"]
    _, _, meta = train_code_model(**{**entry.settings, "steps": CURVE_STEPS}, tokenizer=entry.tokenizer(), progress=False)
    assert meta["corpus"]["sha256"] == entry.metadata()["corpus"]["sha256"]
    mine, shipped = meta["loss_curve"], entry.metadata()["loss_curve"][: CURVE_STEPS // 50]
    assert len(mine) == len(shipped) == CURVE_STEPS // 50
    assert max(abs(a - b) for a, b in zip(mine, shipped)) <= CURVE_BAND
    assert mine[-1] < mine[0] - 1.0  # it learns: 7.9 -> 5.9 on the shipped curve


@pytest.mark.slow
@pytest.mark.full
def test_the_recipe_goes_through_the_phase_change_and_forms_the_circuit():
    """code-2l's recipe from the recorded seed, with the shipped tokenizer, for its first 2,500 steps:
    the loss curve follows the shipped one before the phase change, drops at the same step within the
    band, and the model copies on repeated random tokens with a previous-token head in layer 0."""
    entry = SHIPPED_MODELS["code-2l"]
    model, _, meta = train_code_model(**{**entry.settings, "steps": PHASE_STEPS}, tokenizer=entry.tokenizer(), progress=False)
    assert meta["corpus"]["sha256"] == entry.metadata()["corpus"]["sha256"]
    mine, shipped = meta["loss_curve"], entry.metadata()["loss_curve"][: PHASE_STEPS // 50]
    assert len(mine) == len(shipped) == PHASE_STEPS // 50
    before = 1750 // 50
    assert max(abs(a - b) for a, b in zip(mine[:before], shipped[:before])) <= CURVE_BAND
    assert abs(_phase_change_step(mine) - _phase_change_step(shipped)) <= PHASE_BAND
    assert abs(sum(mine[-8:]) / 8 - sum(shipped[-8:]) / 8) <= LATE_BAND
    first, repeat = repeated_sequence_losses(model, n=64, seed=777)
    assert first - repeat >= 2.0  # measured 6.8 and 7.2 on the two kernel paths
    g = torch.Generator().manual_seed(778)
    seq = torch.randint(0, model.cfg.d_vocab, (64, 32), generator=g)
    assert EXPECTED["code.prev_token"].holds(float(ri.prev_token_scores(model, torch.cat([seq, seq], 1))[0].max()))  # measured 0.47, 0.50


@pytest.mark.slow
@pytest.mark.full
def test_full_retraining_reproduces_the_shipped_metrics():
    """The full recipe (4,000 steps, 18 minutes on one thread): the recorded metrics within the
    registry's tolerance, and the circuit formed. Not in CI (``pytest -m full`` runs it); the
    300-step check above runs on every CI run."""
    entry = SHIPPED_MODELS["code-2l"]
    model, _, meta = train_code_model(**entry.settings, tokenizer=entry.tokenizer(), progress=False)
    assert meta["corpus"]["sha256"] == entry.metadata()["corpus"]["sha256"]
    assert entry.outside_tolerance(meta) == {}
    _assert_induction_circuit(model)


def test_identifier_prompts_can_be_completed_by_induction():
    """Each prompt ends on a token that occurred earlier, and what followed it there is the answer:
    the completion is in the context, for an induction head to copy."""
    from rs_interp.reproduce.sections.code import IDENTIFIERS, _prompts

    tok = load_code_tokenizer(toy_model_path("code-2l"))
    toks, answers = _prompts(tok)
    assert toks.shape[0] == answers.shape[0] == len(IDENTIFIERS)
    for row, answer in zip(toks, answers):
        last = int(row[-1])
        earlier = [i for i in range(len(row) - 1) if int(row[i]) == last]
        assert earlier and int(row[earlier[-1] + 1]) == int(answer)
