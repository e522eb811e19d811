"""One simulated vLLM-like serving pod: continuous batching in discrete steps.

Each step has a token budget. Every decoding sequence takes one token of it; what is left goes
to chunked prefill, first of sequences already admitted, then of waiting requests admitted in
FIFO order while their whole prompt fits in the free KV cache (head-of-line blocking, as in
vLLM). A step lasts

    (base_ms + prefill_ms_per_token * prefill_tokens + decode_ms_per_seq * num_decoding
     + ctx_ms_per_ktoken * context_tokens / 1000) * slowdown * jitter

and its effects (tokens produced, completions) land at its end. When decoding sequences cannot
grow in the KV cache, the newest running sequence is preempted and later recomputed.

Prefix caching: the pod remembers, per prompt family, how many prefix tokens it holds, in LRU
order, within ``prefix_cache_capacity_tokens``. A budget separate from the KV usage keeps a
busy pod's hits (in vLLM, prefix blocks pinned by running sequences stay hittable). A hit is
looked up at admission, so a prefix evicted between routing and admission is missed, and it
shortens the prefill.

Decode progress is kept as aggregates plus a heap of finish steps rather than touched per
sequence per step; a step costs O(prefill chunks + completions), which is what makes tens of
thousands of requests simulate in seconds.

KV accounting is in tokens (no block rounding). Units: times in seconds unless named ``_ms``.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from stack.workload import SimRequest

_WAITING, _PREFILL, _DECODE = 0, 1, 2


@dataclass(frozen=True)
class PodConfig:
    """Capacity and speed of one pod. Defaults: roughly an 8B model on one modern GPU."""

    max_batched_tokens: int = 2048  # token budget per step
    max_num_seqs: int = 256  # running-set cap
    kv_capacity_tokens: int = 131072
    prefix_cache_capacity_tokens: int = 65536
    base_ms: float = 10.0  # fixed cost of a step (weights read, scheduling, sampling)
    prefill_ms_per_token: float = 0.018
    decode_ms_per_seq: float = 0.1
    ctx_ms_per_ktoken: float = 0.08  # attention over the batch's context
    frontend_overhead_ms: float = 10.0  # HTTP, tokenisation, detokenisation: added to TTFT only
    slowdown: float = 1.0  # > 1 makes a slower (heterogeneous) pod
    step_jitter_frac: float = 0.05  # uniform multiplicative noise on each step's duration
    pod_type: str = ""

    def __post_init__(self) -> None:
        if self.max_batched_tokens < 1 or self.max_num_seqs < 1 or self.kv_capacity_tokens < 2:
            raise ValueError("max_batched_tokens, max_num_seqs and kv_capacity_tokens must be positive")
        if self.max_num_seqs > self.max_batched_tokens:
            raise ValueError("max_num_seqs must not exceed max_batched_tokens (decodes take a token each)")
        if self.slowdown <= 0 or not 0.0 <= self.step_jitter_frac < 1.0:
            raise ValueError("slowdown must be > 0 and step_jitter_frac in [0, 1)")


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request with the routing-time feature row of the pod that served it."""

    request: SimRequest
    pod: int
    routed_at_s: float
    features: dict[str, Any]
    ttft_ms: float
    tpot_ms: float  # 0.0 means "no TPOT" (output_tokens <= 1)
    finished_s: float
    preemptions: int = 0
    # The pod's load when the request finished (its KV cache use, waiting and running requests, the
    # request itself gone): what llm-d's EPP puts in a TPOT sample, its metrics refreshed at each token.
    finished_load: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class FirstToken:
    """A request's first token, with its routing-time row: what a streaming scheduler (llm-d's
    EPP) reports as a TTFT-only training sample the moment the token arrives."""

    request: SimRequest
    pod: int
    routed_at_s: float
    features: dict[str, Any]
    ttft_ms: float
    at_s: float


class _Seq:
    __slots__ = (
        "decode_start_step",
        "finish_step",
        "first_token_s",
        "generated",
        "key",
        "kv_tokens",
        "preemptions",
        "prefill_left",
        "req",
        "routed_at_s",
        "row",
        "state",
    )

    def __init__(self, req: SimRequest, routed_at_s: float, row: dict[str, Any]) -> None:
        self.req = req
        self.routed_at_s = routed_at_s
        self.row = row
        self.state = _WAITING
        self.kv_tokens = req.prompt_tokens  # tokens to (re)prefill: prompt, plus output after preemption
        self.prefill_left = 0
        self.generated = 0
        self.first_token_s: float | None = None
        self.decode_start_step = 0  # step at whose end decoding began
        self.finish_step = 0
        self.key = 0
        self.preemptions = 0


class SimPod:
    """Discrete-step engine of one pod; driven by ``advance_to`` and fed by ``enqueue``."""

    def __init__(self, index: int, cfg: PodConfig, seed: int) -> None:
        self.index = index
        self.cfg = cfg
        self._rng = random.Random(seed)
        self.clock_s = 0.0  # end of the last finished step
        self._step_end_s: float | None = None  # end of the step in progress, if any
        self._step = 0  # index of the last scheduled step
        self._chunks: list[tuple[_Seq, int]] = []  # prefill work of the step in progress
        self._waiting: deque[_Seq] = deque()
        self._running: dict[int, _Seq] = {}  # admission order, so the newest is last
        self._prefilling: deque[_Seq] = deque()  # running sequences still prefilling, FIFO
        self._decode_heap: list[tuple[int, int, _Seq]] = []  # (finish step, key, seq); lazy deletion
        self._next_key = 0
        self._num_decoding = 0
        self.kv_used_tokens = 0
        self._decode_ctx_tokens = 0  # KV held by decoding sequences
        self._waiting_prompt_tokens = 0
        self._running_prefill_left = 0
        self._prefix_cache: OrderedDict[int, int] = OrderedDict()  # family -> cached prefix tokens
        self._prefix_cached_tokens = 0
        self.peak_kv_used_tokens = 0
        self.num_preemptions = 0
        self.num_steps = 0
        self.first_tokens: list[FirstToken] | None = None  # a list: first tokens are recorded there

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def busy(self) -> bool:
        return bool(self._running or self._waiting)

    def cached_prefix_tokens(self, req: SimRequest) -> int:
        return min(self._prefix_cache.get(req.family, 0), req.prefix_tokens, req.prompt_tokens)

    def feature_row(self, req: SimRequest) -> dict[str, Any]:
        """Wire feature row for routing ``req`` here now.

        ``decode_tokens_in_flight`` is the KV context (prompt + generated tokens) held by the
        sequences in the decode phase: it is what each decode step must attend over.
        ``prefill_tokens_in_flight`` counts waiting prompts in full (their prefix hit is only
        known at admission) plus what admitted sequences still have to prefill.
        """
        return {
            "kv_cache_percentage": self.kv_used_tokens / self.cfg.kv_capacity_tokens,
            "input_token_length": req.prompt_tokens,
            "num_request_waiting": len(self._waiting),
            "num_request_running": len(self._running),
            "num_tokens_generated": 1,
            "prefix_cache_score": self.cached_prefix_tokens(req) / req.prompt_tokens,
            "pod_type": self.cfg.pod_type,
            "prefill_tokens_in_flight": self._waiting_prompt_tokens + self._running_prefill_left,
            "decode_tokens_in_flight": self._decode_ctx_tokens,
            "encoder_matched_size": 0,
            "encoder_input_size": 0,
        }

    def enqueue(self, req: SimRequest, now_s: float, row: dict[str, Any]) -> None:
        if req.prompt_tokens < 1 or req.output_tokens < 1:
            raise ValueError(f"request {req.request_id}: prompt_tokens and output_tokens must be >= 1")
        if req.prompt_tokens + req.output_tokens > self.cfg.kv_capacity_tokens:
            # It could never finish here: rejecting it beats a preemption livelock.
            raise ValueError(f"request {req.request_id} does not fit in pod {self.index}'s KV cache")
        seq = _Seq(req, now_s, row)
        self._waiting.append(seq)
        self._waiting_prompt_tokens += seq.kv_tokens

    def advance_to(self, t_s: float, out: list[Completion]) -> None:
        """Run every step that ends by ``t_s``; start the next one if it starts before ``t_s``.

        A request enqueued exactly at a step boundary joins the step that starts there.
        """
        while True:
            if self._step_end_s is not None:
                if self._step_end_s > t_s:
                    return
                self._end_step(out)
            if not self._running:
                if not self._waiting:
                    return
                start_s = max(self.clock_s, min(s.routed_at_s for s in self._waiting))
            else:
                start_s = self.clock_s
            if start_s >= t_s:
                return
            self._start_step(start_s)

    def _start_step(self, start_s: float) -> None:
        cfg = self.cfg
        cap = cfg.kv_capacity_tokens
        while self.kv_used_tokens + self._num_decoding > cap:
            self._preempt_newest()
        self._step += 1
        n_dec = self._num_decoding
        self.kv_used_tokens += n_dec
        self._decode_ctx_tokens += n_dec
        budget = cfg.max_batched_tokens - n_dec
        ctx = self._decode_ctx_tokens
        prefill_tokens = 0
        chunks: list[tuple[_Seq, int]] = []
        for seq in self._prefilling:
            if budget <= 0:
                break
            chunk = min(seq.prefill_left, budget)
            chunks.append((seq, chunk))
            budget -= chunk
            prefill_tokens += chunk
            ctx += seq.kv_tokens - seq.prefill_left + chunk
        waiting = self._waiting
        while budget > 0 and waiting and len(self._running) < cfg.max_num_seqs:
            seq = waiting[0]
            if self.kv_used_tokens + seq.kv_tokens > cap:
                break  # FIFO: nobody overtakes the head
            waiting.popleft()
            self._waiting_prompt_tokens -= seq.kv_tokens
            hit = self._prefix_hit(seq)
            seq.prefill_left = seq.kv_tokens - hit
            seq.state = _PREFILL
            seq.key = self._next_key
            self._next_key += 1
            self._running[seq.key] = seq
            self._prefilling.append(seq)
            self._running_prefill_left += seq.prefill_left
            self.kv_used_tokens += seq.kv_tokens
            chunk = min(seq.prefill_left, budget)
            chunks.append((seq, chunk))
            budget -= chunk
            prefill_tokens += chunk
            ctx += hit + chunk
        if self.kv_used_tokens > self.peak_kv_used_tokens:
            self.peak_kv_used_tokens = self.kv_used_tokens
        step_ms = (
            cfg.base_ms
            + cfg.prefill_ms_per_token * prefill_tokens
            + cfg.decode_ms_per_seq * n_dec
            + cfg.ctx_ms_per_ktoken * ctx * 1e-3
        ) * cfg.slowdown
        if cfg.step_jitter_frac:
            step_ms *= 1.0 + cfg.step_jitter_frac * (2.0 * self._rng.random() - 1.0)
        self._chunks = chunks
        self._step_end_s = start_s + step_ms * 1e-3
        self.num_steps += 1

    def _end_step(self, out: list[Completion]) -> None:
        assert self._step_end_s is not None
        t_s = self._step_end_s
        step = self._step
        self.clock_s = t_s
        self._step_end_s = None
        heap = self._decode_heap
        while heap and heap[0][0] <= step:
            finish_step, _, seq = heapq.heappop(heap)
            if seq.state != _DECODE or seq.finish_step != finish_step:
                continue  # stale entry of a preempted sequence
            held = seq.kv_tokens + (step - seq.decode_start_step)
            self._num_decoding -= 1
            self._decode_ctx_tokens -= held
            self.kv_used_tokens -= held
            seq.generated = seq.req.output_tokens
            self._finish(seq, t_s, out)
        for seq, chunk in self._chunks:
            seq.prefill_left -= chunk
            self._running_prefill_left -= chunk
            if seq.prefill_left:
                continue
            # Completed prefills are a FIFO prefix of the deque: only the last chunk can be partial.
            self._prefilling.popleft()
            self._remember_prefix(seq.req)
            seq.generated += 1  # the last prefill chunk samples a token
            if seq.first_token_s is None:
                seq.first_token_s = t_s
                if self.first_tokens is not None:
                    self.first_tokens.append(
                        FirstToken(seq.req, self.index, seq.routed_at_s, seq.row, self._ttft_ms(seq), t_s)
                    )
            if seq.generated >= seq.req.output_tokens:
                self.kv_used_tokens -= seq.kv_tokens
                self._finish(seq, t_s, out)
                continue
            seq.state = _DECODE
            seq.decode_start_step = step
            seq.finish_step = step + seq.req.output_tokens - seq.generated
            heapq.heappush(heap, (seq.finish_step, seq.key, seq))
            self._num_decoding += 1
            self._decode_ctx_tokens += seq.kv_tokens
        self._chunks = []

    def _finish(self, seq: _Seq, t_s: float, out: list[Completion]) -> None:
        del self._running[seq.key]
        req = seq.req
        assert seq.first_token_s is not None
        ttft_ms = self._ttft_ms(seq)
        tpot_ms = (t_s - seq.first_token_s) * 1e3 / (req.output_tokens - 1) if req.output_tokens > 1 else 0.0
        load = {
            "kv_cache_percentage": self.kv_used_tokens / self.cfg.kv_capacity_tokens,
            "num_request_waiting": len(self._waiting),
            "num_request_running": len(self._running),
        }
        out.append(
            Completion(
                req, self.index, seq.routed_at_s, seq.row, ttft_ms, tpot_ms, t_s, seq.preemptions, load
            )
        )

    def _ttft_ms(self, seq: _Seq) -> float:
        assert seq.first_token_s is not None
        return (seq.first_token_s - seq.routed_at_s) * 1e3 + self.cfg.frontend_overhead_ms

    def _preempt_newest(self) -> None:
        """Recompute-style preemption: free the newest sequence's KV and requeue it at the head."""
        seq = self._running.pop(next(reversed(self._running)))
        if seq.state == _DECODE:
            decoded = self._step - seq.decode_start_step
            held = seq.kv_tokens + decoded
            self._num_decoding -= 1
            self._decode_ctx_tokens -= held
            self.kv_used_tokens -= held
            seq.generated += decoded
            seq.kv_tokens = seq.req.prompt_tokens + seq.generated
        else:
            self._prefilling.remove(seq)
            self._running_prefill_left -= seq.prefill_left
            self.kv_used_tokens -= seq.kv_tokens
        seq.state = _WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(seq)
        self._waiting_prompt_tokens += seq.kv_tokens

    def _prefix_hit(self, seq: _Seq) -> int:
        family = seq.req.family
        cached = self._prefix_cache.get(family)
        if not cached or not seq.req.prefix_tokens:
            return 0
        self._prefix_cache.move_to_end(family)
        return min(cached, seq.req.prefix_tokens, seq.kv_tokens - 1)  # the last token is always computed

    def _remember_prefix(self, req: SimRequest) -> None:
        if not req.prefix_tokens:
            return
        cached = self._prefix_cache.get(req.family, 0)
        if req.prefix_tokens > cached:
            self._prefix_cache[req.family] = req.prefix_tokens
            self._prefix_cached_tokens += req.prefix_tokens - cached
        self._prefix_cache.move_to_end(req.family)
        limit = self.cfg.prefix_cache_capacity_tokens
        cache = self._prefix_cache
        while self._prefix_cached_tokens > limit and cache:
            _, tokens = cache.popitem(last=False)
            self._prefix_cached_tokens -= tokens
