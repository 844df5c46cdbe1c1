"""Issue 61 item 1: files are checked, not trusted. Every format rs_interp reads is written here valid, then
corrupted one way at a time (a flipped byte, a cut, bad JSON, a tensor of the wrong shape, a part missing);
its reader must raise :class:`rs_interp.FileError` (one type, a ``ValueError``) whose message names the file
and says what is wrong, never another library's raw exception and never a silently wrong load."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

import rs_interp as ri
from rs_interp._files import digest, read_csv, read_json, read_safetensors, read_torch
from rs_interp._messages import LIMIT
from rs_interp.circuits import read_mib, write_mib
from rs_interp.features import CrossLayerTranscoder, Transcoder, TranscoderSet, load_clt, load_transcoders
from rs_interp.features.formats import load_pchlenski_transcoders, load_sparsify_transcoders
from rs_interp.models.code_model import read_tokenizer
from rs_interp.tasks import read_eap_csv

G = torch.Generator().manual_seed(0)


def _flip(path: Path, tensor: str = "embed.W_E") -> None:
    """One bit of one byte of the data of ``tensor`` in the safetensors file ``path`` flipped (its header's offsets)."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    start = 8 + n + json.loads(data[8: 8 + n])[tensor]["data_offsets"][0]
    data[start + 1] ^= 0x10
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_tensors(path: Path, change: Callable[[dict], None]) -> None:
    """Rewrite the safetensors file ``path`` with ``change`` applied to its tensors."""
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# ---- the formats: each writes a valid copy and returns (read it, its files by role) ------------------------------


def _checkpoint(tmp: Path):
    path = ri.models.save_model(ri.models.make_attn_only(1, d_model=8, n_heads=2, d_head=4, d_vocab=16, n_ctx=8), tmp / "m")
    return (lambda: ri.models.load_model(path)), {"config": tmp / "m.json", "weights": tmp / "m.safetensors"}


def _old_checkpoint(tmp: Path):
    """A checkpoint as save_model wrote it before digests: no ``digests`` entry."""
    read, files = _checkpoint(tmp)
    _edit_json(files["config"], lambda d: d.pop("digests"))
    return read, files


def _hf_gpt2(tmp: Path, loader: str = "load_gpt2"):
    from tokenizers import Tokenizer, models
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)).save_pretrained(tmp)
    words = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(49)} | {"[UNK]": 49}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(tmp)
    return (lambda: getattr(ri, loader)(tmp, dtype=torch.float64)), {"config": tmp / "config.json",
                                                                       "weights": tmp / "model.safetensors",
                                                                       "tokenizer": tmp / "tokenizer.json"}


def _hf_llama(tmp: Path):
    """A Llama checkpoint (load_pretrained's own path: not GPT-2's), tiny and random, with its tokenizer."""
    from tests.hf_families import save_checkpoint

    save_checkpoint("llama", tmp)
    return (lambda: ri.load_pretrained(tmp, dtype=torch.float64)), {"config": tmp / "config.json",
                                                                      "weights": tmp / "model.safetensors",
                                                                      "tokenizer": tmp / "tokenizer.json"}


def _transcoders(tmp: Path):
    tcs = TranscoderSet(tuple(Transcoder(8, 12, activation="topk", k=2) for _ in range(2)))
    tcs.save(tmp)
    return (lambda: load_transcoders(tmp)), {"config": tmp / "config.yaml", "weights": tmp / "layer_0.safetensors"}


def _clt(tmp: Path):
    CrossLayerTranscoder.random(2, 8, 12, activation="jumprelu").save(tmp)
    return (lambda: load_clt(tmp)), {"config": tmp / "config.yaml", "weights": tmp / "W_dec_0.safetensors",
                                     "encoder": tmp / "W_enc_1.safetensors"}


def _pchlenski(tmp: Path):
    files = []
    for l in range(2):
        sd = {"W_enc": torch.randn(8, 12, generator=G), "b_enc": torch.zeros(12), "W_dec": torch.randn(12, 8, generator=G),
              "b_dec": torch.zeros(8), "b_dec_out": torch.zeros(8)}
        files.append(tmp / f"t{l}.pt")
        torch.save({"cfg": {"hook_point": f"blocks.{l}.ln2.hook_normalized"}, "state_dict": sd}, files[-1])
    return (lambda: load_pchlenski_transcoders(files)), {"weights": files[1]}


def _sparsify(tmp: Path):
    for l in range(2):
        sub = tmp / f"layers.{l}.mlp"
        sub.mkdir()
        (sub / "cfg.json").write_text(json.dumps({"d_in": 8, "k": 2, "transcode": True}))
        save_file({"encoder.weight": torch.randn(12, 8, generator=G), "encoder.bias": torch.zeros(12),
                   "W_dec": torch.randn(12, 8, generator=G), "b_dec": torch.zeros(8)}, str(sub / "sae.safetensors"))
    return (lambda: load_sparsify_transcoders(tmp)), {"config": tmp / "layers.1.mlp" / "cfg.json",
                                                      "weights": tmp / "layers.1.mlp" / "sae.safetensors"}


def _tuned_lens(tmp: Path):
    lens = ri.TunedLens(("embed", "L0"), torch.zeros(2, 8, 8), torch.zeros(2, 8), {"steps": 0})
    path = lens.save(tmp / "lens")
    return (lambda: ri.TunedLens.load(path)), {"config": tmp / "lens.json", "weights": tmp / "lens.safetensors"}


def _jacobian_lens(tmp: Path, checkpoint: bool):
    lens = ri.JacobianLens(torch.randn(2, 8, 8, generator=G), (0, 1), n_prompts=3, metadata={"corpus": "x"})
    path = tmp / "lens.pt"
    if checkpoint:  # the reference's fit checkpoint: the running sum and the prompts done
        torch.save({"jacobian_sum": {0: 3 * lens.matrix(0), 1: 3 * lens.matrix(1)}, "n_done": 3, "next_idx": 3,
                    "source_layers": [0, 1], "target_layer": 2, "skip_first": 16}, path)
    else:
        lens.save(path)
    return (lambda: ri.JacobianLens.load(path)), {"weights": path}


def _mib(tmp: Path, suffix: str):
    cfg = ri.models.make_attn_only(1, d_model=8, n_heads=2, d_head=4, d_vocab=16, n_ctx=8).cfg
    layout = ri.edge_layout(cfg)
    scores = ri.circuits.EdgeEffects(layout, torch.where(layout.exists, 1.0, torch.nan), float("nan"))
    path = write_mib(tmp / f"graph{suffix}", cfg, scores=scores)
    return (lambda: read_mib(path, cfg)), {"config" if suffix == ".json" else "weights": path}


def _eap_csv(tmp: Path):
    from rs_interp.tokenizers import gpt2_tokenizer

    path = tmp / "ioi.csv"
    path.write_text("clean,corrupted,correct_idx,incorrect_idx\nWhen Mary and John went,When Anna and Paul went,5335,1757\n")
    tok = gpt2_tokenizer()
    return (lambda: read_eap_csv(path, "ioi", tok)), {"table": path}


def _tokenizer(tmp: Path):
    from tokenizers import Tokenizer, models

    path = tmp / "tokenizer.json"
    Tokenizer(models.WordLevel(vocab={"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(path))
    return (lambda: read_tokenizer(path)), {"config": path}


FORMATS = {"checkpoint": _checkpoint, "old checkpoint": _old_checkpoint, "gpt2 folder": _hf_gpt2,
           "hf folder": _hf_llama, "transcoders": _transcoders, "clt": _clt,
           "pchlenski": _pchlenski, "sparsify": _sparsify, "tuned lens": _tuned_lens,
           "jacobian lens": lambda tmp: _jacobian_lens(tmp, False),
           "jacobian checkpoint": lambda tmp: _jacobian_lens(tmp, True),
           "mib json": lambda tmp: _mib(tmp, ".json"), "mib pt": lambda tmp: _mib(tmp, ".pt"), "eap csv": _eap_csv,
           "tokenizer": _tokenizer}


def _shape(path: Path) -> None:
    """One tensor of ``path`` (the first in name order of the rank >= 1 ones) given one more row."""
    def change(t: dict) -> None:
        name = next(k for k in sorted(t) if t[k].ndim >= 1)
        t[name] = torch.cat([t[name], t[name][:1]])
    _edit_tensors(path, change)


def _drop(path: Path) -> None:
    """The first tensor of ``path`` (name order) removed."""
    _edit_tensors(path, lambda t: t.pop(sorted(t)[0]))


#: corruption -> (the file it acts on, what it does, what the message must say)
CORRUPTIONS = {
    "missing config": ("config", Path.unlink, r"does not exist|no config|not a Hugging Face|is missing"),
    "missing weights": ("weights", Path.unlink, r"does not exist|holds no weights|is missing"),
    "truncated weights": ("weights", _cut, r"truncated|cannot be read by torch"),
    "garbage weights": ("weights", lambda p: p.write_bytes(b"\x00\x01garbage" * 3), r"truncated|not a|cannot be read by torch"),
    "bad JSON": ("config", lambda p: p.write_text('{"config": [1, 2'), r"not valid JSON|malformed|cannot be read"),
    "flipped weight byte": ("weights", _flip, r"digest"),
    "flipped config byte": ("config", lambda p: p.write_text(p.read_text().replace('"n_ctx": 8', '"n_ctx": 9')), r"digest"),
    "wrong shape": ("weights", _shape, r"shape|digest|another shape"),
    "tensor missing": ("weights", _drop, r"lacks|lack |missing|digest|malformed|has no"),
    "encoder cut": ("encoder", _cut, r"truncated"),
    "not UTF-8": ("table", lambda p: p.write_bytes(b"clean,corrupted\n\xff\xfe"), r"not UTF-8"),
    "no column": ("table", lambda p: p.write_text("clean,corrupted\na,b\n"), r"no column correct_idx"),
    "label not an integer": ("table", lambda p: p.write_text(p.read_text().replace("5335", "five")), r"not an integer"),
    "bad tokenizer": ("config", lambda p: p.write_text('{"model": 3}'), r"cannot be read"),
    "tokenizer cut": ("tokenizer", _cut, r"not valid JSON"),
}

#: the corruptions each format can have (a flipped weight byte is caught where a digest is stored: rs_interp's
#: checkpoints; other formats have none, and their readers cannot see it)
CASES = [(fmt, c) for fmt, cs in {
    "checkpoint": ["missing config", "missing weights", "truncated weights", "garbage weights", "bad JSON",
                   "flipped weight byte", "flipped config byte", "wrong shape", "tensor missing"],
    "old checkpoint": ["truncated weights", "bad JSON", "wrong shape", "tensor missing"],
    "gpt2 folder": ["missing weights", "truncated weights", "bad JSON", "wrong shape", "tensor missing", "tokenizer cut"],
    "hf folder": ["missing weights", "truncated weights", "garbage weights", "bad JSON", "wrong shape", "tensor missing",
                  "tokenizer cut"],
    "transcoders": ["missing config", "missing weights", "truncated weights", "bad JSON", "wrong shape", "tensor missing"],
    "clt": ["missing weights", "truncated weights", "bad JSON", "wrong shape", "tensor missing", "encoder cut"],
    "pchlenski": ["missing weights", "truncated weights", "garbage weights"],
    "sparsify": ["truncated weights", "bad JSON", "wrong shape", "tensor missing", "missing weights"],
    "tuned lens": ["missing config", "missing weights", "truncated weights", "bad JSON", "wrong shape", "tensor missing"],
    "jacobian lens": ["missing weights", "truncated weights", "garbage weights"],
    "jacobian checkpoint": ["missing weights", "truncated weights", "garbage weights"],
    "mib json": ["missing config", "bad JSON"],
    "mib pt": ["missing weights", "truncated weights", "garbage weights"],
    "eap csv": ["not UTF-8", "no column", "label not an integer"],
    "tokenizer": ["bad JSON", "bad tokenizer"],
}.items() for c in cs]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_reads_when_whole(tmp_path, fmt):
    """What the matrix below corrupts loads as written (so each refusal there is the corruption's)."""
    read, _ = FORMATS[fmt](tmp_path)
    assert read() is not None


@pytest.mark.parametrize("fmt, corruption", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_a_corrupted_file_is_refused_by_name(tmp_path, fmt, corruption):
    read, files = FORMATS[fmt](tmp_path)
    role, corrupt, reason = CORRUPTIONS[corruption]
    corrupt(files[role])
    with pytest.raises(ri.FileError) as info:
        read()
    message = str(info.value)
    # named by its folder: a Hugging Face folder without any weight file (which files it lacks is said), and a sparsify
    # coder whose tensors do not fit together (the reader's refusals name the folder)
    folder = (fmt in ("hf folder", "gpt2 folder") and corruption == "missing weights"
              or fmt == "sparsify" and corruption in ("wrong shape", "tensor missing"))
    named = tmp_path.name if folder else files[role].name
    assert named in message, message
    assert re.search(reason, message), message
    assert isinstance(info.value, ValueError) and len(message.replace(str(tmp_path), "TMP")) <= LIMIT, message


def test_a_checkpoint_error_is_a_file_error(tmp_path):
    read, files = _checkpoint(tmp_path)
    _flip(files["weights"])
    with pytest.raises(ri.models.CheckpointError, match=r"tensor '[\w.]+' does not match its sha256 digest") as info:
        read()
    assert isinstance(info.value, ri.FileError) and info.value.path == files["weights"]


def test_a_checkpoint_without_digests_loads_unchecked(tmp_path):
    """The rule for files saved before digests (load_model's docstring): they load with names and shapes checked,
    so a flipped weight byte goes through, as it did for every file before (the issue's case); with digests the
    same flip is refused (the matrix above)."""
    read, files = _old_checkpoint(tmp_path)
    before = torch.cat([p.detach().flatten() for p in read().parameters()])
    _flip(files["weights"])
    after = torch.cat([p.detach().flatten() for p in read().parameters()])
    assert not torch.equal(before.nan_to_num(0), after.nan_to_num(0))


def test_the_shipped_checkpoints_carry_digests_that_hold():
    """Every shipped checkpoint's JSON holds the digests of its weights as shipped (they were added to the JSON,
    the weights untouched), so a damaged install is refused by name."""
    for name, entry in ri.models.SHIPPED_MODELS.items():
        payload = read_json(entry.path.with_name(name + ".json"), "config")
        tensors = read_safetensors(entry.path.with_name(name + ".safetensors"), "weights")
        assert payload["digests"]["tensors"] == {k: digest(v) for k, v in tensors.items()}, name


def test_the_readers_name_what_they_read(tmp_path):
    with pytest.raises(ri.FileError, match=r"config .*absent\.json does not exist\."):
        read_json(tmp_path / "absent.json", "config")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ri.FileError, match=r"holds a JSON list, not an object"):
        read_json(tmp_path / "list.json", "config")
    with pytest.raises(ri.FileError, match=r"is a folder, not a file"):
        read_safetensors(tmp_path, "weights")
    (tmp_path / "x.pt").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ri.FileError, match=r"x\.pt is truncated or not a PyTorch file"):
        read_torch(tmp_path / "x.pt", "graph")
    (tmp_path / "t.csv").write_text('a,b\n"open quote,1\n')
    assert read_csv(tmp_path / "t.csv", "table") == [{"a": "open quote,1\n", "b": None}]
