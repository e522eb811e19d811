"""Seeded synthetic request stream for the pod simulator.

Arrivals follow a two-state Markov-modulated Poisson process: the stream alternates between
a calm and a burst state with exponentially distributed sojourn times, and the two rates are
chosen so that the long-run mean is ``rate_rps`` whatever the burstiness. Prompt and output
lengths are clipped lognormals; optionally (``long_prompt_share`` > 0) a share of the prompts
comes from a second, long lognormal, the bimodal shape of real traces (llm-d's
``bimodal-h200`` profile: inputs 61 to 12,352 tokens, median 3,411; ``chatbot-synthetic``:
median 6,497). With the share at 0 no extra draws are made, so existing streams are unchanged.
Every request belongs to a prompt *family* (a shared system
prompt or conversation) drawn with Zipf popularity; the family's prefix is what a pod's prefix
cache can reuse.

Iterating a ``Workload`` twice yields the same requests: each iteration restarts the
generator from ``cfg.seed``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request as the scheduler sees it on arrival."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    family: int
    prefix_tokens: int  # leading prompt tokens shared with the rest of the family
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None


@dataclass(frozen=True)
class WorkloadConfig:
    """Shape of the synthetic stream; every length is in tokens, every time in seconds."""

    rate_rps: float = 20.0  # long-run mean arrival rate
    burstiness: float = 0.5  # 0 = plain Poisson, 1 = on/off (no arrivals while calm)
    burst_fraction: float = 0.2  # share of time spent in the burst state
    mean_burst_s: float = 5.0  # mean length of one burst
    num_requests: int | None = 1000  # stop after this many requests ...
    duration_s: float | None = None  # ... or at this time, whichever comes first
    seed: int = 0
    prompt_median_tokens: float = 700.0
    prompt_sigma: float = 1.0
    prompt_min_tokens: int = 50
    prompt_max_tokens: int = 8000
    long_prompt_share: float = 0.0  # share of prompts drawn from the long mode instead
    long_prompt_median_tokens: float = 6000.0
    long_prompt_sigma: float = 0.4
    long_prompt_max_tokens: int = 12352
    output_median_tokens: float = 120.0
    output_sigma: float = 1.0
    output_min_tokens: int = 5
    output_max_tokens: int = 1000
    num_families: int = 64
    family_zipf_s: float = 1.1
    family_prefix_median_tokens: float = 600.0
    family_prefix_sigma: float = 0.8
    shared_prefix_prob: float = 0.8  # otherwise the prompt shares nothing with its family
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None

    def __post_init__(self) -> None:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("set num_requests or duration_s, or the workload never ends")
        if self.rate_rps <= 0:
            raise ValueError("rate_rps must be > 0")
        if not 0.0 <= self.burstiness <= 1.0:
            raise ValueError("burstiness must be in [0, 1]")
        if not 0.0 < self.burst_fraction < 1.0:
            raise ValueError("burst_fraction must be in (0, 1)")
        if self.mean_burst_s <= 0 or self.num_families < 1:
            raise ValueError("mean_burst_s must be > 0 and num_families >= 1")
        if not 1 <= self.prompt_min_tokens <= self.prompt_max_tokens:
            raise ValueError("need 1 <= prompt_min_tokens <= prompt_max_tokens")
        if not 0.0 <= self.long_prompt_share <= 1.0 or self.long_prompt_max_tokens < self.prompt_min_tokens:
            raise ValueError(
                "long_prompt_share must be in [0, 1] and long_prompt_max_tokens >= prompt_min_tokens"
            )
        if not 1 <= self.output_min_tokens <= self.output_max_tokens:
            raise ValueError("need 1 <= output_min_tokens <= output_max_tokens")


class Workload:
    """Finite, time-ordered stream of ``SimRequest``s described by a ``WorkloadConfig``."""

    def __init__(self, cfg: WorkloadConfig) -> None:
        self.cfg = cfg

    def __iter__(self) -> Iterator[SimRequest]:
        cfg = self.cfg
        rng = np.random.default_rng(cfg.seed)
        family_prefix = _clipped_lognormal(
            rng, cfg.num_families, cfg.family_prefix_median_tokens, cfg.family_prefix_sigma, 16, 4096
        )
        popularity = 1.0 / np.arange(1, cfg.num_families + 1) ** cfg.family_zipf_s
        popularity /= popularity.sum()

        # Rates such that p*burst + (1-p)*calm == rate_rps for every burstiness.
        p = cfg.burst_fraction
        calm_rps = cfg.rate_rps * (1.0 - cfg.burstiness)
        burst_rps = cfg.rate_rps * (1.0 + cfg.burstiness * (1.0 - p) / p)
        mean_calm_s = cfg.mean_burst_s * (1.0 - p) / p

        limit = cfg.num_requests if cfg.num_requests is not None else -1
        end_s = cfg.duration_s if cfg.duration_s is not None else float("inf")
        emitted = 0
        t_s = 0.0
        in_burst = bool(rng.random() < p)
        while t_s < end_s and emitted != limit:
            seg_end_s = min(t_s + rng.exponential(cfg.mean_burst_s if in_burst else mean_calm_s), end_s)
            n = int(rng.poisson((burst_rps if in_burst else calm_rps) * (seg_end_s - t_s)))
            arrivals = np.sort(rng.uniform(t_s, seg_end_s, n)).tolist()
            if limit >= 0 and n > limit - emitted:
                n = limit - emitted  # keep the earliest arrivals, not fewer spread over the segment
                arrivals = arrivals[:n]
            if n:
                prompts = _clipped_lognormal(
                    rng,
                    n,
                    cfg.prompt_median_tokens,
                    cfg.prompt_sigma,
                    cfg.prompt_min_tokens,
                    cfg.prompt_max_tokens,
                )
                if cfg.long_prompt_share > 0:
                    long = _clipped_lognormal(
                        rng,
                        n,
                        cfg.long_prompt_median_tokens,
                        cfg.long_prompt_sigma,
                        cfg.prompt_min_tokens,
                        cfg.long_prompt_max_tokens,
                    )
                    prompts = np.where(rng.random(n) < cfg.long_prompt_share, long, prompts)
                outputs = _clipped_lognormal(
                    rng,
                    n,
                    cfg.output_median_tokens,
                    cfg.output_sigma,
                    cfg.output_min_tokens,
                    cfg.output_max_tokens,
                )
                families = rng.choice(cfg.num_families, size=n, p=popularity)
                shared = rng.random(n) < cfg.shared_prefix_prob
                # At least one prompt token is always the request's own.
                prefixes = np.where(shared, np.minimum(family_prefix[families], prompts - 1), 0)
                columns = (arrivals, prompts.tolist(), outputs.tolist(), families.tolist(), prefixes.tolist())
                for i, (arrival_s, prompt, output, family, prefix) in enumerate(zip(*columns, strict=True)):
                    yield SimRequest(
                        request_id=emitted + i,
                        arrival_s=arrival_s,
                        prompt_tokens=prompt,
                        output_tokens=output,
                        family=family,
                        prefix_tokens=prefix,
                        ttft_slo_ms=cfg.ttft_slo_ms,
                        tpot_slo_ms=cfg.tpot_slo_ms,
                    )
                emitted += n
            t_s = seg_end_s
            in_burst = not in_burst


def _clipped_lognormal(
    rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int
) -> np.ndarray:
    values = median * np.exp(sigma * rng.standard_normal(n))
    return np.clip(np.rint(values), lo, hi).astype(np.int64)
