"""The finance case study: five readers on seen and unseen companies."""

from __future__ import annotations

from ...finance import READERS, run_case_study
from ...plots import finance_figure
from ..context import Context, Row, Section, banded


def finance_section(ctx: Context) -> Section:
    """The five readers on seen and unseen companies, and the demo filing."""
    ctx.log("finance: generating the corpus and training the filing model")
    res = run_case_study(seed=ctx.seed, induction_1l=ctx.model("induction-1l"), induction_2l=ctx.model("induction-2l"),
                         progress=ctx.progress)
    rows = []
    for r in READERS:
        rows.append(banded(f"finance.{r}.seen", f"{r}: seen companies", res.seen[r]))
        rows.append(banded(f"finance.{r}.unseen", f"{r}: unseen companies", res.unseen[r]))
    rows.append(banded("finance.ambiguous_seen", "seen queries on a symbol with several successors in training (share)",
                       res.diagnostics["ambiguous_seen"]))
    rows.append(banded("finance.filing_model_induction", "filing-trained model: largest weight on i-p+1 (repeated random symbols)",
                       res.diagnostics["filing_model_induction"]))
    rows.append(Row("queries: seen / unseen", f"{res.n_queries['seen']} / {res.n_queries['unseen']}", "269 / 336", "report", None))
    demo = {r: f"{sum(v)} of {len(v)}" for r, v in res.demo.items()}
    for r in READERS:
        rows.append(Row(f"demo filing: {r}", demo[r], "11 of 12" if r == "induction model, two layers" else "0", "report", None))
    results = {"seen": res.seen, "unseen": res.unseen, "n_queries": res.n_queries, "diagnostics": res.diagnostics,
               "demo": {"queries": list(res.demo_queries), "completed": {r: v for r, v in res.demo.items()}}}
    return Section("finance", "Finance case study: completing company names by induction", tuple(rows), results,
                   figures=(finance_figure(res.seen, res.unseen),),
                   notes="Synthetic filings (seeded, generated in-process); words hashed to 256 symbols by CRC-32.")
