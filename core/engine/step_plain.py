"""Plain decoding, double-buffered as mlx-lm's: each step is queued with the previous
step's tokens still on the device, before those are read back."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .prefill import first_tokens_of, keep_prefill_states
from .results import GenerationResult
from .sampling import choose
from .scorer import Segment, forward
from .sequence import Sequence


class PlainSteps:
    """A batch's double-buffered plain steps; `lag` is the step in flight (its rows and
    their tokens, on the device), read by the next step or by `read_lag`."""

    def __init__(self, batch):
        self.batch = batch
        self.lag: tuple[list[Sequence], mx.array] | None = None

    def run(self) -> list[GenerationResult]:
        """Plain decoding, double-buffered like mlx-lm: this step is queued on the device
        with the previous step's tokens still there, before those are read back. A row
        that turns out to have finished (EOS) was computed once more for nothing."""
        b = self.batch
        b.admission.admit()
        prefill = b.prefill.plan()
        lag_rows, lag_tokens = self.lag or ([], None)
        lagging = {s.uid: j for j, s in enumerate(lag_rows)}
        decode = []
        for s in b.rows:
            if s is None or s.finish_reason is not None:
                continue
            if s.uid in lagging:  # its next input is the previous step's token, on the device
                known = len(s.output) + 1
                if known < s.max_tokens:
                    decode.append(s)
            elif s.output:
                decode.append(s)
        segments = []
        if decode:
            host = np.array([0 if s.uid in lagging else s.pending for s in decode], np.int32)
            ids = mx.array(host)
            dev = [i for i, s in enumerate(decode) if s.uid in lagging]
            if dev:
                src = mx.array([lagging[decode[i].uid] for i in dev])
                ids[mx.array(dev)] = lag_tokens[src]
            segments.append(Segment([s.slot for s in decode], [[0]] * len(decode), ids=ids))
        if prefill:
            segments.append(
                Segment([s.slot for s, _ in prefill], [c for _, c in prefill], logits="last")
            )
        launched: tuple[list[Sequence], mx.array] | None = None
        if segments:
            states = [] if b.reads_states else None
            outs = forward(b.target.model, b.cache, segments, states=states)
            if states:
                b.commit.keep_states(decode, states[0] if decode else None)
                keep_prefill_states(prefill, states[-1] if prefill else None)
            rows, picks = [], []
            if decode:
                pos = b.cache.lengths[[s.slot for s in decode]] + 1  # after the input
                seeds = np.array([s.seed for s in decode], dtype=np.uint32)
                picks.append(choose(outs[0], [s.params for s in decode], seeds, pos))
                rows += decode
                for s in decode:  # its input is in the cache now
                    b.cache.lengths[s.slot] += 1
            if prefill:
                for s, c in prefill:
                    s.prefilled += len(c)
                    b.cache.lengths[s.slot] += len(c)
                done = [i for i, (s, _) in enumerate(prefill) if s.prefilled == len(s.prompt)]
                if done:
                    first, _ = first_tokens_of(
                        [prefill[i][0] for i in done], outs[-1], done, len(prefill)
                    )
                    picks.append(first)
                    rows += [prefill[i][0] for i in done]
            if rows:
                tokens = picks[0] if len(picks) == 1 else mx.concatenate(picks)
                mx.async_eval(tokens)
                launched = (rows, tokens)
            else:  # prefill alone, no prompt ending: computed now (see `_step`)
                mx.async_eval(outs[-1])
        results = b.commit.results()
        if lag_rows:
            b.commit.plain(lag_rows, lag_tokens.tolist())  # the step's one sync
        self.lag = launched
        b.steps += 1
        return results

    def read_lag(self) -> None:
        """Leaving double-buffered plain decoding: read and commit its step in flight."""
        if self.lag is not None:
            rows, tokens = self.lag
            self.lag = None
            with self.batch.draining("plain"):
                self.batch.commit.plain(rows, tokens.tolist())
