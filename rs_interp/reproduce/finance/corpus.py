"""The finance corpus: synthetic filings, hashed tokens and the queries (see :mod:`rs_interp.reproduce.finance`).

The corpus is synthetic, seeded and generated here in well under a second; nothing is downloaded.

**Roster.** 96 public companies in 12 sectors, 8 per sector. A name has two to four words:
a distinctive first word unique to the company (``"Tamsin"``), optionally a qualifier shared
across sectors (``"North"``, ``"United"``...), the sector's word (``"Retail"``), and optionally
one of the sector's two corporate suffixes (``"Group"`` or ``"Stores"`` for retail):
``"Tamsin Retail Group"``. Each company has a
ticker made of its initials plus a letter. The roster splits 75/25 *by sector*: nine sectors
(72 companies) are the training companies, three sectors (24 companies) are held out, so the
held-out names (their first and sector words) never occur in training.

**Filings.** Short English documents (tickers, figures, boilerplate sentences): the first
sentence names the company in full; later sentences name it in full again, or say "the
company" or give the ticker, with figures drawn at random. Three sets: 300 filings about
training companies (to train on), 100 new filings about the same companies ("seen"), and 100
about the held-out companies ("unseen").

**Tokens.** Words (punctuation split off) are hashed to 256 symbols by CRC-32 of the UTF-8 word,
modulo 256: stable across processes and machines, unlike Python's salted ``hash``.

**Queries.** A word of a multi-word company name, other than its last, at a mention whose full
name the same filing already gave within the 48 words before it; the answer is the name's next
word. A reader sees the (at most) 48 symbols ending at the query word and completes the query
when its top prediction is the answer's symbol.

>>> corpus = make_corpus()
>>> len(corpus.train), len(corpus.seen), len(corpus.unseen)
(300, 100, 100)
>>> word_symbol("Retail") == word_symbol("Retail")
True
"""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "N_CTX",
    "D_VOCAB",
    "word_symbol",
    "tokenize",
    "Company",
    "Filing",
    "Corpus",
    "make_corpus",
    "Query",
    "find_queries",
    "demo_filing",
]

N_CTX = 48
D_VOCAB = 256

# sector -> (sector word, the sector's corporate suffixes)
_SECTORS = {
    "retail": ("Retail", ("Group", "Stores")), "energy": ("Energy", ("Resources", "Power")),
    "mining": ("Mining", ("Minerals", "Metals")), "shipping": ("Shipping", ("Lines", "Maritime")),
    "pharma": ("Pharma", ("Therapeutics", "Laboratories")), "banking": ("Bancorp", ("Financial", "Trust")),
    "telecom": ("Telecom", ("Networks", "Communications")), "software": ("Software", ("Systems", "Technologies")),
    "insurance": ("Assurance", ("Underwriters", "Mutual")), "airlines": ("Airways", ("Aviation", "Air")),
    "foods": ("Foods", ("Brands", "Farms")), "steel": ("Steel", ("Works", "Forge")),
}
_FIRST = (
    "Tamsin Harlow Bexley Corwin Dunmore Elstree Fenwick Garrow Halden Islay Jessop Kelvin Lorne Marden Norland Orwell "
    "Pellam Quarry Rennick Selby Tarrant Ulster Vance Wexford Yarrow Ashby Brantley Calder Dalby Eskdale Farrow "
    "Glenmore Hawick Ingram Jarrow Kirkby Lomond Merrow Nairn Ossory Penrith Quinlan Rydal Stanmore Thirsk Upton "
    "Verity Walden Ardmore Bramwell Carrick Denholm Ellery Foxley Gilmour Hadley Inverness Juniper Kestrel Larkin "
    "Morven Nettle Oakham Prescott Ravel Sutter Tolland Umber Valen Winslow Arden Blythe Colwyn Darrow Elgin Fairlie "
    "Gresham Holloway Ivory Jolliet Kenmare Linden Mallory Newell Orrin Pryor Redfern Sorrel Tavish Ulric Vesper "
    "Whitby Alder Brigham Castell Delmore"
).split()
_QUALIFIERS = ("North", "United", "Pacific", "Atlantic", "General", "First", "National", "Western")
_FILLER = [
    "reported quarterly revenue of {num} million , up {pct} percent from a year earlier .",
    "The board declared a dividend of {small} per share , payable next quarter .",
    "Operating margin was {pct} percent , compared with {pct2} percent in the prior period .",
    "Management expects capital expenditure of {num} million for the fiscal year .",
    "Net debt stood at {num} million at the end of the quarter .",
    "The company repurchased {num} thousand shares during the period .",
    "Shares of {ticker} closed at {small} on the exchange .",
    "Cash from operations rose to {num} million .",
    "The company will hold its annual meeting in {month} .",
    "Headcount increased by {pct} percent to {num} employees .",
    "The auditors issued an unqualified opinion on the financial statements .",
    "Risk factors are described in the annual report filed in {month} .",
]
_MENTIONS = [
    "{name} ( {ticker} ) said that",
    "According to {name} ,",
    "{name} also noted that",
    "In a statement , {name} said",
    "Analysts covering {name} expect that",
]
# Figures come from small sets, as rounded figures in filings do: the hashed vocabulary stays small.
_NUMS = (12, 15, 18, 24, 30, 36, 40, 45, 60, 75, 90, 120, 150, 180, 240, 300, 360, 450, 600, 750, 900)
_SMALL = ("0.25", "0.40", "0.50", "0.75", "1.10", "1.25", "1.50", "2.00", "2.40", "3.10", "4.50")
_MONTHS = "January February March April May June July August September October November December".split()


def word_symbol(word: str) -> int:
    """The symbol of a word: CRC-32 of its UTF-8 bytes modulo 256 (stable, unsalted)."""
    return zlib.crc32(word.encode("utf-8")) % D_VOCAB


def tokenize(text: str) -> tuple[list[str], list[int]]:
    """Split ``text`` into words (punctuation as its own words) and hash each to a symbol."""
    words = re.findall(r"[A-Za-z0-9.]+|[^\sA-Za-z0-9]", text)
    words = [w for w in words if w]
    return words, [word_symbol(w) for w in words]


@dataclass(frozen=True)
class Company:
    name: tuple[str, ...]
    sector: str
    ticker: str

    @property
    def full_name(self) -> str:
        return " ".join(self.name)


@dataclass(frozen=True)
class Filing:
    company: Company
    words: tuple[str, ...]
    symbols: tuple[int, ...]
    mentions: tuple[int, ...]  # start index of every full mention of the company's name


@dataclass(frozen=True)
class Corpus:
    roster: tuple[Company, ...]
    train_companies: tuple[Company, ...]
    heldout_companies: tuple[Company, ...]
    train: tuple[Filing, ...]
    seen: tuple[Filing, ...]
    unseen: tuple[Filing, ...]


def _roster(rng: random.Random) -> list[Company]:
    firsts = list(_FIRST)
    rng.shuffle(firsts)
    companies, used_tickers = [], set()
    for s_index, (sector, (sector_word, suffixes)) in enumerate(_SECTORS.items()):
        for k in range(8):
            first = firsts[s_index * 8 + k]
            n_words = rng.choice((2, 3, 3, 4))
            if n_words == 2:
                name = (first, sector_word)
            elif n_words == 3:
                name = (first, sector_word, rng.choice(suffixes))
            else:
                name = (first, rng.choice(_QUALIFIERS), sector_word, rng.choice(suffixes))
            ticker = "".join(w[0] for w in name).upper()
            while ticker in used_tickers:
                ticker += chr(ord("A") + rng.randrange(26))
            used_tickers.add(ticker)
            companies.append(Company(name=name, sector=sector, ticker=ticker))
    return companies


def _as_filing(company: Company, text: str) -> Filing:
    """Tokenize ``text`` and find every full mention of ``company``'s name."""
    words, symbols = tokenize(text)
    n = len(company.name)
    mentions = tuple(i for i in range(len(words) - n + 1) if tuple(words[i : i + n]) == company.name)
    return Filing(company=company, words=tuple(words), symbols=tuple(symbols), mentions=mentions)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _filing(company: Company, rng: random.Random) -> Filing:
    def fill(template: str) -> str:
        return template.format(num=rng.choice(_NUMS), pct=rng.randint(1, 30), pct2=rng.randint(1, 30),
                               small=rng.choice(_SMALL), month=rng.choice(_MONTHS),
                               ticker=company.ticker, name=company.full_name)

    parts = [fill("{name} ( {ticker} ) " + rng.choice(_FILLER[:1]))]
    for _ in range(rng.randint(3, 5)):
        filler = [fill(rng.choice(_FILLER)) for _ in range(rng.choice((0, 0, 1)))]
        parts.extend(filler)
        if rng.random() < 0.75:
            parts.append(fill(rng.choice(_MENTIONS)) + " " + _lower_first(fill(rng.choice(_FILLER[1:6]))))
        else:
            parts.append("The company said that " + _lower_first(fill(rng.choice(_FILLER[1:6]))))
    return _as_filing(company, " ".join(parts))


def make_corpus(seed: int = 0, *, n_train: int = 300, n_seen: int = 100, n_unseen: int = 100) -> Corpus:
    """Generate the roster and the three sets of filings (seeded; see the module docstring)."""
    rng = random.Random(seed)
    roster = _roster(rng)
    sectors = list(_SECTORS)
    rng.shuffle(sectors)
    heldout_sectors = set(sectors[: len(sectors) // 4])
    train_c = tuple(c for c in roster if c.sector not in heldout_sectors)
    held_c = tuple(c for c in roster if c.sector in heldout_sectors)
    make = lambda cs, n: tuple(_filing(rng.choice(cs), rng) for _ in range(n))  # noqa: E731
    return Corpus(roster=tuple(roster), train_companies=train_c, heldout_companies=held_c,
                  train=make(train_c, n_train), seen=make(train_c, n_seen), unseen=make(held_c, n_unseen))


@dataclass(frozen=True)
class Query:
    """One query: the symbols a reader sees (ending at the query word) and the answer's symbol."""

    filing: int
    position: int  # index of the query word in the filing
    context: tuple[int, ...]
    answer: int
    query_word: str
    answer_word: str


def find_queries(filings: Sequence[Filing]) -> list[Query]:
    """Every query of the given filings (see the module docstring)."""
    out = []
    for f_index, f in enumerate(filings):
        n = len(f.company.name)
        for m_index, start in enumerate(f.mentions):
            for k in range(n - 1):
                pos = start + k
                ctx_start = max(0, pos - N_CTX + 1)
                # an earlier full mention must lie inside the window the reader sees
                if not any(s >= ctx_start for s in f.mentions[:m_index]):
                    continue
                out.append(Query(filing=f_index, position=pos, context=tuple(f.symbols[ctx_start : pos + 1]),
                                 answer=f.symbols[pos + 1], query_word=f.words[pos], answer_word=f.words[pos + 1]))
    return out


def demo_filing(company: Company, *, seed: int = 1, mentions: int = 8) -> Filing:
    """A held-out filing naming ``company`` in full ``mentions`` times (with a figure between mentions)."""
    rng = random.Random(seed)
    parts = [f"{company.full_name} ( {company.ticker} ) reported quarterly revenue of {rng.choice(_NUMS)} million ."]
    templates = ["{name} said revenue rose {pct} percent .", "Shares of {name} closed at {small} .",
                 "{name} declared a dividend of {small} per share .",
                 "Analysts expect {name} to report {num} million ."]
    for i in range(mentions - 1):
        parts.append(templates[i % len(templates)].format(name=company.full_name, pct=rng.randint(1, 30),
                                                          small=rng.choice(_SMALL), num=rng.choice(_NUMS)))
    return _as_filing(company, " ".join(parts))


