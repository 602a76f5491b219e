"""Forced tokens as drafts: where a row's grammar allows one continuation only (a key, the
punctuation between items, the rest of an enum value once its prefix is unique), those
tokens are drafted with certainty (grammar.RowGrammar.forced).

A lookup: host work, offered to the policy with a chance of 1 per token, so a row whose next
tokens are forced drafts them and the other drafters draft the free parts. Verification is
as for any draft (the target's masked choice at each node), so output stays exactly plain
constrained decoding; a forced token the target would tokenize otherwise is simply rejected.
Rows without a grammar get nothing.
"""

from __future__ import annotations

from .base import Draft


class ForcedDrafter:
    name = kind = "forced"
    lookup = True
    calibrated = True  # its chances are the grammar's: no per-row warm-up or probes
    prior = None

    def admit(self, seq) -> None:
        pass

    def propose(self, seqs, ks: list[int]) -> Draft:
        toks = [
            s.grammar.forced(k) if s.grammar is not None else []
            for s, k in zip(seqs, ks, strict=True)
        ]
        return Draft(
            sizes=[len(t) for t in toks],
            tokens=toks,
            chances=[[1.0] * len(t) for t in toks],
            source=self.name,
        )

    def commit(self, seqs, draft: Draft, paths) -> None:
        pass

    def retire(self, seq) -> None:
        pass

    def step_cost(self, rows: int) -> float:
        return 0.0

    def evidence(self) -> int:
        return 0
