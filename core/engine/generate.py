"""The engine: draft -> verify -> accept -> roll back, one request at a time.

Each verify step forwards [last committed token, draft tokens...] through the target (or,
for early exit, only layers >= L from the draft's own hidden states), lets the acceptance
routine keep a prefix and pick the next token, and trims the rejected positions from the
cache. One host sync per verify step. `none` uses mlx-lm's double-buffered loop instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import generation_stream

from .acceptance import accept, accept_tree
from .costs import CostCurve, measure_verify_curve
from .draft_length import PRIORS, AcceptanceStats, AdaptiveK, FixedK
from .drafters.auto import AutoDrafter, Scheduled
from .drafters.base import Draft
from .drafters.draft_model import DraftModelDrafter
from .drafters.early_exit import EarlyExitDrafter
from .drafters.ngram import NgramDrafter, TextIndex
from .drafters.tree import TreeDrafter
from .forward import embed, forward, last_logits, lm_head, make_cache, run_layers, trim
from .loading import load_model
from .metrics import Phase, RequestMetrics
from .model import LoadedModel
from .sampling import GenerationParams, KeyStream, log_target, make_draft_sampler
from .tree import TokenTree, parse_shape
from .tree_forward import check_supported, compact, tree_forward

PREFILL_CHUNK = 512
DRAFTERS = "none | ngram | early-exit:L | draft-model:NAME | auto | tree | tree:3,2,1"


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, EOS excluded
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    speculative: dict
    timing: dict


def parse_draft_spec(spec: str) -> tuple[str, str | None]:
    """`early-exit:8` -> ("early-exit", "8"). Raises ValueError naming the valid forms."""
    kind, _, arg = spec.partition(":")
    if kind in ("none", "ngram", "auto", "tree") and not arg:
        return kind, None
    if kind == "early-exit" and arg.isdigit():
        return kind, arg
    if kind == "draft-model" and arg:
        return kind, arg
    if kind == "tree" and arg:
        parse_shape(arg)  # tree:3,2,1 = static branching per depth (needs a draft model)
        return kind, arg
    raise ValueError(f"unknown drafter {spec!r}; expected one of: {DRAFTERS}")


class Engine:
    """A resident target model that generates with speculative decoding.

    Args:
        target: the model whose output distribution is reproduced exactly.
        draft: drafter spec (`none`, `ngram`, `early-exit:L`, `draft-model:NAME`, `auto`).
        k: fixed draft length; None = adaptive (bounded by the measured verify-cost curve).
        draft_model: the loaded model for `draft-model:NAME` (loaded by name if omitted);
            with `auto` it joins the n-gram drafter as a fallback.
        cost: the verify-cost curve; measured on first use if omitted.
        draft_cost: one draft-model token in units of one target step; measured on first
            use if omitted.
        profile: evaluate at phase boundaries so draft/verify/accept/cache times are exact
            (a few extra host syncs per step); off, those phases are reported as null.
        double_buffer: for `none`, queue the next step before reading the current token
            (mlx-lm's loop); False runs plain decoding through the speculative loop instead,
            which is how the bench measures what double-buffering buys.
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: str = "auto",
        k: int | None = None,
        draft_model: LoadedModel | None = None,
        cost: CostCurve | None = None,
        draft_cost: float | None = None,
        profile: bool = True,
        double_buffer: bool = True,
    ):
        self.kind, self.arg = parse_draft_spec(draft)
        if k is not None and k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if self.kind == "early-exit":
            EarlyExitDrafter(target.model, [], int(self.arg))  # validates the layer now
        if self.kind == "tree":
            check_supported(target.model)
            if self.arg and draft_model is None:
                raise ValueError("a static tree shape (tree:3,2,1) needs a draft model")
        if self.kind == "draft-model" and draft_model is None:
            draft_model = load_model(self.arg)
        if draft_model is not None and draft_model.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft model {draft_model.name} has vocabulary {draft_model.vocab_size}, "
                f"target {target.name} has {target.vocab_size}: they must share a tokenizer"
            )
        self.target = target
        self.draft_spec = draft
        self.k = k
        self.draft_model = draft_model
        self._cost = cost
        self._draft_cost = draft_cost
        self.profile = profile
        self.double_buffer = double_buffer
        # Per drafter: acceptance by draft position, carried from request to request.
        self.acceptance: dict[str, AcceptanceStats] = {}

    @classmethod
    def load(
        cls, model: str = "smollm2-135m", draft: str = "auto", k: int | None = None, **kw
    ) -> Engine:
        parse_draft_spec(draft)  # fail on a bad spec before loading anything
        return cls(load_model(model), draft=draft, k=k, **kw)

    @property
    def draft_cost(self) -> float:
        """One draft-model token in units of one target step, measured here: a small model
        is not proportionally faster everywhere (on an H200 both are latency-bound)."""
        if self._draft_cost is None:
            with mx.stream(generation_stream):
                ms = measure_verify_curve(self.draft_model.model, widths=(1,)).ms[0]
            self._draft_cost = ms / self.cost.ms[0]
        return self._draft_cost

    @property
    def cost(self) -> CostCurve:
        if self._cost is None:
            with mx.stream(generation_stream):
                self._cost = measure_verify_curve(self.target.model)
        return self._cost

    # -- drafters -------------------------------------------------------------------------

    def _policy(self, kind: str, draft_cost: float = 0.0):
        if self.k:
            return FixedK(self.k)
        if kind not in self.acceptance:
            self.acceptance[kind] = AcceptanceStats(PRIORS[kind])
        return AdaptiveK(self.cost, self.acceptance[kind], draft_cost=draft_cost)

    def _ngram(self) -> NgramDrafter:
        t = self.target
        return NgramDrafter(text=TextIndex(t.decode, t.encode_text))

    def _param_share(self, modules) -> float:
        n = sum(v.size for m in modules for _, v in _leaves(m))
        return n / sum(v.size for _, v in _leaves(self.target.model))

    def _model_drafter(self, cache) -> Scheduled | None:
        m = self.target.model
        if self.kind == "early-exit":
            L = int(self.arg)
            share = self._param_share(m.model.layers[:L]) + self._param_share(
                [m.lm_head if hasattr(m, "lm_head") else m.model.embed_tokens]
            )
            return Scheduled(EarlyExitDrafter(m, cache, L), self._policy("early-exit", share))
        if self.draft_model is not None:
            drafter = DraftModelDrafter(self.draft_model)
            return Scheduled(drafter, self._policy("model", self.draft_cost))
        return None

    def _plan(self, cache):
        if self.kind == "tree":
            shape = parse_shape(self.arg) if self.arg else None
            return TreeDrafter(self.cost, self.draft_model, max_nodes=self.k, shape=shape)
        if self.kind == "ngram":
            return Scheduled(self._ngram(), self._policy("ngram"))
        if self.kind == "auto":
            cands = [Scheduled(self._ngram(), self._policy("ngram"))]
            if (md := self._model_drafter(cache)) is not None:
                cands.append(md)
            return AutoDrafter(cands)
        if self.kind == "none":
            return AutoDrafter([])  # no candidates: every step is a plain step
        return self._model_drafter(cache)

    # -- generation -----------------------------------------------------------------------

    def chat(self, messages: list[dict], params: GenerationParams) -> GenerationResult:
        return self.generate(self.target.encode_chat(messages), params)

    def generate(self, prompt: list[int], params: GenerationParams) -> GenerationResult:
        """Generate a completion of `prompt` (token ids) under `params`."""
        ctx = self.target.context_length
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= ctx:
            raise ValueError(f"prompt has {len(prompt)} tokens; the model's context is {ctx}")
        max_tokens = min(params.max_tokens, ctx - len(prompt))
        mx.reset_peak_memory()
        metrics = RequestMetrics(drafter=self.draft_spec, profiled=self.profile)
        keys = KeyStream(params.seed)
        with mx.stream(generation_stream):
            cache = make_cache(self.target.model)
            logits = self._prefill(prompt, cache)  # (1, V)
            first = self._sample(logits, params, keys)
            if self.kind == "none" and self.double_buffer:
                out, reason = self._plain(first, cache, params, keys, max_tokens, metrics)
            else:
                out, reason = self._speculate(
                    prompt, first, cache, params, keys, max_tokens, metrics
                )
        metrics.t_end = time.perf_counter()
        if self.kind == "none" and self.double_buffer:  # all decode time is verification
            metrics.phases["verify_s"] = metrics.t_end - metrics.t_first
        return GenerationResult(
            tokens=out,
            text=self.target.decode(out),
            finish_reason=reason,
            prompt_tokens=len(prompt),
            speculative=metrics.speculative(),
            timing=metrics.timing(len(out)),
        )

    def _prefill(self, prompt: list[int], cache) -> mx.array:
        model = self.target.model
        toks = mx.array([prompt], dtype=mx.int32)
        for i in range(0, len(prompt) - PREFILL_CHUNK, PREFILL_CHUNK):
            run_layers(model, embed(model, toks[:, i : i + PREFILL_CHUNK]), cache)
            mx.eval([c.state for c in cache])
        rest = len(prompt) - (len(prompt) - 1) // PREFILL_CHUNK * PREFILL_CHUNK
        return last_logits(model, toks[:, -rest:], cache)

    @staticmethod
    def _sample(logits: mx.array, params: GenerationParams, keys: KeyStream) -> mx.array:
        """(1, V) logits -> (1,) token under the target distribution."""
        if params.greedy:
            return mx.argmax(logits, axis=-1)
        return mx.random.categorical(log_target(logits, params), key=keys.next())

    def _plain(self, y, cache, params, keys, max_tokens, metrics):
        """Plain decoding, double-buffered like mlx-lm: the next step is queued before the
        current token is read back."""
        model, eos = self.target.model, self.target.eos_token_ids
        out: list[int] = []
        mx.async_eval(y)
        while True:
            last = len(out) + 1 >= max_tokens
            if not last:
                nxt = self._sample(forward(model, y[:, None], cache)[:, -1], params, keys)
                mx.async_eval(nxt)
            t = y.item()
            if metrics.t_first is None:
                metrics.t_first = time.perf_counter()
            else:
                metrics.record_step("none", 0, 0, 1)
            if t in eos:
                return out, "stop"
            out.append(t)
            if last:
                return out, "length"
            y = nxt

    def _speculate(self, prompt, first, cache, params, keys, max_tokens, metrics):
        model, eos, profile = self.target.model, self.target.eos_token_ids, self.profile
        plan = self._plan(cache)
        sampler = make_draft_sampler(params, keys)
        t = first.item()
        metrics.t_first = time.perf_counter()
        if t in eos:
            return [], "stop"
        out, history = [t], list(prompt) + [t]
        plan.begin(prompt)
        while len(out) < max_tokens:
            with Phase(metrics, "draft_s"):
                draft: Draft = plan.step(history, sampler)
                if profile:
                    mx.eval(draft.tokens, draft.hidden, draft.probs)
            k = draft.length
            if draft.parents is not None:  # a token tree: drafters/tree.py
                n, new = self._tree_step(draft, history[-1], cache, params, keys, metrics, plan)
            else:
                with Phase(metrics, "verify_s"):
                    if draft.hidden is not None:
                        h = run_layers(model, draft.hidden, cache, draft.start_layer)
                        logits = lm_head(model, h)  # (1, k + 1, V)
                    else:
                        inp = mx.concatenate([mx.array([[history[-1]]], mx.int32), draft.tokens], 1)
                        logits = forward(model, inp, cache)  # (1, k + 1, V)
                    if profile:
                        mx.eval(logits)
                with Phase(metrics, "accept_s"):
                    n, nxt = accept(logits, draft.tokens, draft.probs, params, keys)
                    mx.eval(n, nxt, draft.tokens)  # the step's one host sync
                    n, nxt = n.item(), nxt.item()
                    new = draft.tokens[0, :n].tolist() + [nxt]
                with Phase(metrics, "cache_s"):
                    trim(cache, k - n)
                    plan.commit(draft, n)
            metrics.record_step(draft.source, k, n, len(new))
            for t in new:
                if t in eos:
                    return out, "stop"
                out.append(t)
                history.append(t)
                if len(out) >= max_tokens:
                    break
        return out, "length"

    def _tree_step(self, draft, root, cache, params, keys, metrics, plan):
        """Verify a token tree in one forward and keep only the accepted path in the cache."""
        tree = TokenTree.from_draft(root, draft)
        with Phase(metrics, "verify_s"):
            prefix = cache[0].offset
            logits = tree_forward(self.target.model, tree, cache)  # (1, N, V)
            if self.profile:
                mx.eval(logits)
        with Phase(metrics, "accept_s"):
            res = accept_tree(logits, tree.tokens, tree.parents, params, keys)
            mx.eval(res.num_accepted, res.next_token, res.path)  # the step's one host sync
            n = res.num_accepted.item()
            path = res.path[0, : n + 1].tolist()
            new = [tree.tokens[i] for i in path[1:]] + [res.next_token.item()]
        with Phase(metrics, "cache_s"):
            compact(cache, prefix, path)
            plan.commit(draft, n, path)
        return n, new


def _leaves(module):
    from mlx.utils import tree_flatten

    return tree_flatten(module.parameters())
