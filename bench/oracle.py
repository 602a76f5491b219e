"""A drafter that knows the answer: each row drafts the continuation of a reference output
(plain decoding's, from an earlier pass), as a lookup the policy truncates. It measures the
ceiling of drafting on a machine: what the engine gains where every draft is right, so a
drafter's gap to a target splits into what drafts could still win and what verifying them
costs. Harness code: nothing in the engine imports it.

    configs of bench/step_split.py: '["none", {}]' '["ngram", {"oracle": true}]'
"""

from __future__ import annotations

import dataclasses

from core.engine.drafters.base import Draft
from core.engine.drafters.ngram import NgramDrafter


class OracleDrafter(NgramDrafter):
    """Drafts `reference[prompt][len(output):]` while a row's output is the reference's
    prefix, nothing once it departs (a batch's rounding may take a near-tie the other way).
    A lookup as prompt lookup is, with its kind's prior until the policy has measured it."""

    name = "oracle"

    def __init__(self, reference: dict[tuple[int, ...], list[int]]):
        self.reference = reference

    def admit(self, seq) -> None:
        seq.state[self.name] = self.reference.get(tuple(seq.prompt), [])

    def propose(self, seqs, ks: list[int]) -> Draft:
        toks = []
        for s, k in zip(seqs, ks, strict=True):
            ref, n = s.state[self.name], len(s.output)
            toks.append(ref[n : n + k] if ref[:n] == s.output else [])
        return Draft(sizes=[len(t) for t in toks], tokens=toks, source=self.name)


def install(engine, reqs, outputs) -> None:
    """Every batch `engine` makes drafts with the oracle alone, from `outputs` (results in
    the order of `reqs`)."""
    reference = {tuple(p): o.tokens for (p, _), o in zip(reqs, outputs, strict=True)}
    drafter = OracleDrafter(reference)
    engine.entry = dataclasses.replace(engine.entry, build=lambda ctx, arg: [drafter])
