"""Which kind of step a batch runs: host-synced drafting, the resident loop or plain steps,
each measured against the others in trials on the batch's own steps."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .config import ModeTuning


class StepModes:
    """Which kind of step a batch runs, from the measured tokens per second of each kind,
    wall time included. The kinds: host-synced drafting steps (`draft`: each row's drafter
    chosen by its promise), the feature head's loop resident on the device (`loop`,
    resident.py) where the batch can run it, and plain double-buffered steps (`plain`).

    The surface prices the target's forward; the host work around a drafting step (lookups,
    planning, acceptance, bookkeeping) and the double buffering it gives up are not in it,
    and on an accelerator running a small model they can cost more than the forward. So the
    batch tries each kind. A trial runs the kinds in turn, in blocks of `block` steps, until
    each has run `trial`, so all meet the same rows and the same joining prompts (a job's
    first steps prefill most of its prompts: a trial of one kind alone would charge that to
    it); once every kind has run a block, one `clear` times slower than the fastest leaves
    the trial, which ends when one kind is left. A double-buffered kind's last step (the
    loop's, plain steps') is read by the next kind's first: its tokens and the wait for
    them are credited to the kind that computed them (`credit`). Where the device runs
    ahead of the host (a GPU), such a kind's first step in a block (its entry: the first
    step queued, with nothing of its own to read; the loop's also drafts its first chain
    host-synced) is the host's work alone, the switch's cost, which a trial's alternation
    makes and the winner running on does not pay: it measures nothing in a trial and
    counts toward no block (`observe`'s `entry`; the batch says which steps are entries).
    Counted, it would make the loop look slower than it runs (docs/decisions.md). Outside a trial an entry
    counts: there it follows a row joining or finishing, a cost the kind pays as it runs.
    (On the CPU queueing a step computes most of it: its entry holds its forward and
    counts.) A kind that left the last trial clearly slower runs a first block of `probe`
    steps in the next one, not `block`: it leaves again after that if it is still as slow
    (on an accelerator a host-synced drafting step can cost four plain ones, and on a
    short job the next trials come as its rows finish), and runs its blocks as the others
    do if it is not.

    Then the fastest kind runs, with a new trial after `retry` steps (doubling, up to
    `retry_max`, each time a trial picks the kind the previous one did: a drafter that keeps
    losing costs its trial steps ever more rarely; a change of winner starts again from
    `retry`), or as soon as the live rows have halved or doubled since the last trial and
    the price of a draft token at them (`price`: the verify surface's, `token_cost`) has
    moved by `price_move` of a plain token's or more (at a job's tail drafting can pay
    where it did not at a full batch, on a machine whose verify is compute-bound there;
    where the price is flat, an accelerator's, the rows' count changes nothing; a step that
    leaves no row live, between requests at batch 1, is no such change either), or, while
    another kind than `draft` runs, the drafters' evidence (`Drafter.evidence`: a job's
    answers indexed) has reached `evidence` and doubled since (a job's first wave drafts
    from an empty index; the next one from all that the first wrote). That trial is
    between drafting and the kind that runs: what the drafters learned changes no other.

    A trial's blocks are short (a few steps of a kind), so one trial's rates are noisy. So each
    kind's measurement is pooled (`_pool`): the steps the winner runs between trials count
    toward its rate, and what a trial measures adds to what the earlier ones did, weighed
    down by `decay` at every trial. The winner is the kind with the best pooled rate among
    those still in the trial. A trial that the rows started (halved or doubled where a draft
    token's price moved) forgets what every kind measured before; one that the drafters'
    evidence started forgets what drafting did.
    """

    def __init__(
        self,
        kinds: tuple[str, ...] = ("draft", "plain"),
        price: Callable[[int], float] | None = None,
        tuning: ModeTuning | None = None,
    ):
        self.tuning = tuning or ModeTuning()
        self.kinds = tuple(kinds)
        self.price = price  # live rows -> a draft token's price (None: the rows alone)
        self.rate: dict[str, float | None] = dict.fromkeys(self.kinds)
        self.mode = self.kinds[0]
        self._lost: set[str] = set()  # kinds that left the last trial they ran in so
        self._out: set[str] = set()  # kinds that left the current trial, clearly slower
        self._block: dict[str, int] = {}  # each kind's first block in the current trial
        self._trial: dict[str, list] | None = None  # steps, tokens, seconds by kind; None: none
        self._start_trial(self.kinds)
        self._since = 0  # steps since the last trial ended
        self._rows: int | None = None  # live rows when it ended
        self._evidence = 0  # the drafters' evidence when it ended
        self._retry = self.tuning.retry  # steps until the next trial
        self._won: str | None = None  # the kind the last trial picked
        self.steps = dict.fromkeys(self.kinds, 0)  # steps run of each kind
        # The last trials, oldest first: each kind's (steps, tokens, seconds) and the winner.
        self.trials: deque[tuple[dict[str, tuple[int, int, float]], str]] = deque(maxlen=64)
        # Each kind's tokens and seconds measured before the current trial (class docstring).
        self._pool: dict[str, list[float]] = {m: [0.0, 0.0] for m in self.kinds}

    def _start_trial(self, kinds: tuple[str, ...], forget: tuple[str, ...] = ()) -> None:
        """A trial of `kinds`, the current one first, then the others in turn; the kinds in
        `forget` start from nothing (what they measured before no longer holds)."""
        for m in forget:
            self._pool[m] = [0.0, 0.0]
        self._trial = {m: [0, 0, 0.0] for m in self.kinds if m in kinds}
        self._block = {
            m: self.tuning.probe if m in self._lost else self.tuning.block for m in kinds
        }
        self._out = set()

    def _moved(self, rows: int | None) -> bool:
        """Whether the live rows changed enough since the last trial to try again."""
        if not rows or not self._rows or self._rows < 2 * rows < 4 * self._rows:
            return False  # (no rows live: between requests, as at batch 1; not a change)
        return (
            self.price is None
            or abs(self.price(rows) - self.price(self._rows)) >= self.tuning.price_move
        )

    def credit(self, mode: str, tokens: int, seconds: float) -> None:
        """Tokens a step of `mode` computed that a later step read, and the seconds the
        later one waited for them."""
        if self._trial is not None and mode in self._trial:
            t = self._trial[mode]
            t[1], t[2] = t[1] + tokens, t[2] + seconds
        elif self._trial is None and mode in self._pool:
            self._add(mode, tokens, seconds)

    def _add(self, mode: str, tokens: int, seconds: float) -> None:
        pool = self._pool[mode]
        pool[0], pool[1] = pool[0] + tokens, pool[1] + seconds

    def observe(
        self,
        mode: str,
        tokens: int,
        seconds: float,
        rows: int | None = None,
        evidence: int = 0,
        entry: bool = False,
    ) -> None:
        """One step of `mode` emitted `tokens` in `seconds` with `rows` live rows and the
        drafters' `evidence`; then choose the next step's mode. `entry`: the step queued
        the first of a double-buffered kind's steps and read none of its own (class
        docstring): in a trial it measures nothing and does not count toward its block."""
        self.steps[mode] += 1
        trial = self._trial
        if entry and trial is not None and mode in trial:
            return
        if trial is None:
            self._add(mode, tokens, seconds)
            self._since += 1
            learned = self.mode != "draft" and evidence >= max(
                self.tuning.evidence, 2 * self._evidence
            )
            if self._moved(rows):
                self._start_trial(self.kinds, forget=self.kinds)
            elif self._since >= self._retry:
                self._start_trial(self.kinds)
            elif learned and "draft" in self.kinds:
                self._start_trial((self.mode, "draft"), forget=("draft",))
            return
        t = trial[mode]
        t[0], t[1], t[2] = t[0] + 1, t[1] + tokens, t[2] + seconds
        rates = {m: (tok / sec if sec > 0 else 0.0) for m, (_, tok, sec) in trial.items()}
        if all(trial[m][0] >= self._block[m] for m in trial):
            best = max(rates.values())
            self._out |= {m for m in trial if best >= self.tuning.clear * rates[m]}
        left = [m for m in trial if m not in self._out]
        if len(left) == 1 or all(trial[m][0] >= self.tuning.trial for m in left):  # the trial ended
            for m, (_, tok, sec) in trial.items():
                pool = self._pool[m]
                pool[0], pool[1] = (
                    self.tuning.decay * pool[0] + tok,
                    self.tuning.decay * pool[1] + sec,
                )
            pooled = {m: (tok / sec if sec > 0 else 0.0) for m, (tok, sec) in self._pool.items()}
            self.rate = {**self.rate, **{m: pooled[m] for m in trial}}
            self.mode = max(left, key=lambda m: pooled[m])
            self.trials.append(({m: tuple(v) for m, v in trial.items()}, self.mode))
            self._lost = (self._lost - set(trial)) | self._out
            same = self.mode == self._won
            self._retry = min(2 * self._retry, self.tuning.retry_max) if same else self.tuning.retry
            self._won = self.mode
            self._trial, self._since, self._rows = None, 0, rows or self._rows
            self._evidence = evidence
        elif (
            mode not in left
            or t[0] >= self.tuning.trial
            or (t[0] - self._block[mode]) % self.tuning.block == 0
        ):
            # the next kind in turn that is still to run its trial steps
            turn = self.kinds.index(mode)
            order = self.kinds[turn + 1 :] + self.kinds[: turn + 1]
            self.mode = next(m for m in order if m in left and trial[m][0] < self.tuning.trial)
