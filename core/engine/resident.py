"""The feature head's drafting loop, resident on the device.

A drafting step normally reads its accepted tokens back before the host can build the next
step: acceptance decides each row's cache length, its next pending token and the state the
next draft starts from. That gives up the double buffering plain decoding has
(`step_plain.py`: step n + 1 is queued before step n is read), and on a GPU running a
small model a step that waits for its predecessor pays the whole launch latency that plain
steps hide.

With a fixed chain of K draft tokens a row from the feature head (drafters/feature_head.py),
everything acceptance decides can stay on the device. (The batch chooses K from the head's
measured acceptance and the machine's costs, and leaves the loop to change it:
`LoopSteps.k` in step_loop.py.) Each row's cache lengths (the target's and the head's) are device arrays;
a step

- verifies [pending, d_1 .. d_K] at positions length + (0 .. K): positions, write slots and
  the mask are derived on the device (`Segment.base`);
- accepts a = the length of the drafts' prefix that equals the target's tokens (the token
  after each node: the argmax for a greedy row and for a sampled one the draw of its seed's
  uniform at that position, computed on the device, `sampling.device_uniforms`), so output
  is plain decoding's token for token either way;
- advances both lengths by 1 + a; the next pending token is the target's token after the
  last accepted node;
- runs the head's block over the step's K + 1 pairs (h_p, x_{p+1}) and drafts the next
  chain from the prediction after pair a: each deeper token feeds the predicted state back
  with the token just drafted (EAGLE's chain, as `FeatureHeadDrafter.propose` drafts it).
  Entries past the new lengths (the target's after a rejected draft, the head's pairs
  after pair a and its chain's own) are masked, and overwritten by the next step.

The host builds step n + 1 before it reads step n: it needs only an upper bound of the
lengths (those it has read, plus K + 1 a step in flight) for the read widths. It then
commits step n's tokens while n + 1 runs. A row that finished in step n runs in step n + 1
for nothing (its tokens are dropped); a row the host knows will have reached its max_tokens
is not advanced. Admission, prefill and every other kind of step leave the loop first
(`LoopSteps.leave`): the step in flight is read, and the head is handed the state of each
row's last position to read again, as after any verify step. A learning head (online
learning) keeps the states of every position the loop committed, as its `propose` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .sampling import GenerationParams, choose
from .scorer import Segment, forward
from .sequence import Sequence

IDLE = GenerationParams()  # a slot no live row holds decodes greedily (its tokens are dropped)


@dataclass
class Launched:
    """One loop step queued on the device, read back a step later."""

    rows: list[Sequence | None]  # per segment row: its sequence (None: not advanced)
    picks: mx.array  # (R, K + 1) int32 the target's token after pending and after each draft
    accepted: mx.array  # (R,) int32 the drafts accepted (a prefix of the chain)
    states: mx.array  # (R * (K + 1), D) the target's last-layer states at its nodes


class ResidentLoop:
    """The device state of a batch's rows while they run the loop (module docstring).

    Args:
        batch: the batch whose rows run it (its target cache and capacity).
        head: the batch's feature-head drafter (width 1).
        rows: the decoding rows, each with its pending token read by the head.
        draft: (len(rows), K) int32 the head's chain after each row's pending token.
    """

    def __init__(self, batch, head, rows: list[Sequence], draft: mx.array):
        self.batch, self.head = batch, head
        self.k = int(draft.shape[1])
        cap = batch.capacity
        slots = np.array([s.slot for s in rows], np.int32)
        self.target_len = mx.array(batch.cache.lengths.astype(np.int32))  # (cap,)
        self.head_len = mx.array(head.cache.lengths.astype(np.int32))  # (cap,)
        pending = np.zeros(cap, np.int32)
        pending[slots] = [s.pending for s in rows]
        self.pending = mx.array(pending)  # (cap,) each slot's pending token
        self.draft = mx.zeros((cap, self.k), mx.int32)  # (cap, K) each slot's chain after it
        self.draft[mx.array(slots)] = draft.astype(mx.int32)
        self.in_flight: Launched | None = None

    def launch(self) -> Launched | None:
        """Queue the next step for the batch's live rows, if any would advance; the step
        queued before it (to commit now: it runs or has run ahead of this one), if any."""
        prev = self.in_flight
        self.in_flight = self._queue(unread=prev is not None)
        return prev

    def _queue(self, unread: bool) -> Launched | None:
        """`unread`: a step is in flight, which adds 1 to K + 1 positions to each row."""
        b, K = self.batch, self.k
        live = {}
        for s in b.rows:
            if s is None or s.finish_reason is not None:
                continue
            if len(s.output) + unread < s.max_tokens:  # else it has surely finished
                live[s.slot] = s
        if not live:
            return None
        # On CUDA (a padded cache) every slot takes part in slot order, so the step meets
        # one shape; elsewhere only the live rows run.
        slots = list(range(b.capacity)) if b.cache.pad > 1 else sorted(live)
        seqs = [live.get(i) for i in slots]
        on = mx.array(np.array([s is not None for s in seqs], np.int32))  # (R,)
        sl = mx.array(np.asarray(slots, np.int32))
        R, W = len(slots), K + 1
        hosts = [s.slot for s in live.values()]
        ahead = W if unread else 0  # the most the unread step may add
        t_end = int(b.cache.lengths[hosts].max()) + ahead + W
        h_end = int(self.head.cache.lengths[hosts].max()) + ahead + W
        base = self.target_len[sl] * on  # (R,) a row not advanced writes at 0 .. K (unread)
        draft = self.draft[sl]  # (R, K)
        ids = mx.concatenate([self.pending[sl][:, None], draft], axis=1).reshape(-1)  # (R*W,)
        nodes = [[0] * W] * R
        states: list = []
        seg = Segment(slots, nodes, ids=ids, base=base, end=t_end)
        logits = forward(b.target.model, b.cache, [seg], states=states)[0]  # (R*W, V)
        params = [IDLE if s is None else s.params for s in seqs]
        seeds = np.array([0 if s is None else s.seed for s in seqs], np.uint32)
        greedy = all(p.greedy for p in params)
        if greedy:
            picks = mx.argmax(logits, axis=-1).astype(mx.int32).reshape(R, W)
        else:  # the token after node t sits at position base + t + 1
            at = (base[:, None] + mx.arange(1, W + 1, dtype=mx.int32)[None, :]).reshape(-1)
            each = [p for p in params for _ in range(W)]
            picks = choose(logits, each, np.repeat(seeds, W), at).reshape(R, W)
        # The drafts accepted: the index of the first that is not the target's token, else K.
        miss = mx.where(picks[:, :K] == draft, K, mx.arange(K, dtype=mx.int32)[None, :])
        accepted = mx.min(miss, axis=1).astype(mx.int32) * on  # (R,)
        step = (1 + accepted) * on
        h = states[0]  # (R*W, D) the target's states at pending and at each draft
        model, fh = b.target.model, self.head.adapter.block
        hbase = self.head_len[sl] * on
        x = fh.fuse(model, h, picks.reshape(-1))  # the pairs (h_p, x_{p+1}) of every node
        hseg = Segment(slots, nodes, hidden=x, base=hbase, end=h_end)
        out = forward(model, self.head.cache, [hseg], stop=1, blocks={0: fh.block})[0]
        pred = out[mx.arange(R, dtype=mx.int32) * W + accepted]  # (R, D) after each row's last pair
        new = base + step  # the rows' lengths; the first draft follows the new pending token
        chain = []
        for j in range(K):
            if j:  # the predicted state with the token just drafted, past the read pairs
                x = fh.fuse(model, pred, chain[-1])
                hseg = Segment(slots, [[0]] * R, hidden=x, base=hbase + step + j - 1, end=h_end + j)
                pred = forward(model, self.head.cache, [hseg], stop=1, blocks={0: fh.block})[0]
            if greedy:
                chain.append(self.head.next_tokens(pred))
            else:  # draft token j sits at position new + 1 + j
                chain.append(self.head.next_tokens(pred, params, seeds, new + 1 + j))
        self.draft[sl] = mx.stack(chain, axis=1)
        self.pending[sl] = mx.take_along_axis(picks, accepted[:, None], axis=1)[:, 0]
        self.target_len[sl] = new
        self.head_len[sl] = hbase + step
        launched = Launched(seqs, picks, accepted, h)
        mx.async_eval(picks, accepted, h, self.draft, self.pending, self.target_len, self.head_len)
        return launched

    def drain(self) -> Launched | None:
        """The step still in flight (to commit before the loop ends), if any."""
        prev, self.in_flight = self.in_flight, None
        return prev
