"""Online calibration per regime: a quantile tracker on each regime's residuals between retrains.

For each model and regime (``shared.regimes``) the calibrator keeps an offset that is added to
the served margin (trees + baseline + the trainer's conformal offset) of that regime's rows, and
moves it with every posted batch of samples (online quantile tracking, the "P" part of conformal
PID control, Angelopoulos, Barber and Bates 2023; adaptive conformal inference, Gibbs and Candes
2021, moves the quantile level the same way):

    offset += step * spread * min(n, BATCH_CAP) * (miss rate - (1 - q)),

where a miss is ``log1p(actual) > served margin without regime offsets + offset`` and ``n`` the
batch's samples in that regime. Misses push the offset up, covered samples pull it down, so it
settles where a share ``q`` of the regime's *recent* samples is covered whatever the stream does
(the long-run coverage guarantee of online quantile tracking holds for any sequence), also while
latency trends up through an overload onset and the samples arrive seconds after their request
was routed. A batch counts as at most ``BATCH_CAP`` samples: requests that complete together
shared their conditions, so their errors are one observation, and a per-sample step would
overshoot after every burst. ``spread`` is the 5th-95th percentile range of the regime's recent
residuals (of all regimes while it has fewer than ``min_samples``), so one ``step`` suits TTFT and
TPOT, quiet and overloaded regimes alike.

Each regime's offset is a part shared by all regimes plus its own part. The shared part moves by
the batch's pooled error, each regime of the batch by its own error on top of it: a regime in the
batch moves by its own error only, a regime not in it follows the batch. A change that hits every
regime (a slower pool) is seen first where samples are frequent (no queue) and so reaches the
queue bins that are seen only in bursts before their samples do; a change in one regime moves
that regime and, by its share of the batch, the regimes not seen meanwhile.
The shared part also has a trend term (the "I" part of conformal PID control in spirit, here a
second integrator): a velocity that integrates the shared part's moves, leaking by ``TREND_LEAK``
per batch, added to it with every batch. A tracker alone follows latency that keeps rising (a
queue that builds up through an overload, a trace's load stage) only by missing more often than
``1 - q``: its offset moves by the excess miss rate, so it lags behind by a steady shortfall for as
long as the rise lasts (a rise of 0.5 % per batch with residual noise 0.05 is covered 0.84). The
velocity learns the rise and takes over the move, so the miss rate returns to ``1 - q`` (0.88
there); when the rise stops, the covered samples drain the velocity again. It is on the shared part
only: a regime's own part keeps tracking its own error (a velocity per regime took the change of a
slower pool away from the shared part altogether). It still costs the regimes seen only in
bursts part of what they inherit: after a step, the velocity overshoots, and its correction leaves
more of the change in the frequent regime's own part (a 1.1 step: 0.69-0.81 inherited instead of
0.95-1.06).
The shared part's level is not tied to the regimes with evidence: what it gains they give back in
their own parts, so it may lead them all (by up to 2.1 log units after a slower pool, when the window
already held an earlier slow spell). Only regimes without evidence are served that lead. Bounding
it by the regimes with evidence took it away from the cold first visits to deep queue bins, which
live off it (docs/accuracy-history.md, "The shared offset's lead over the regimes with evidence").
One kind of regime is kept from it: one the trees know better than the trackers do, where the new
trees were fitted on more than twice as many samples as the trackers ever scored (the window was
restored at start or loaded by ``import-trace``, so most of what is known there is evidence the
trackers never saw). At each rebase its own part is set to cancel the shared part, so it is served
the new trees' own calibration plus whatever the shared part moves until the next retrain; if its
held live samples show that calibration short beyond chance, it gets their conformal offset
instead (as any regime whose offset fell short). A cold server's trees are fitted only on samples
that were also scored live, so this never applies to it (unless scoring skipped batches under
overload; then too the trees know those regimes better). The first form of the rule took only
regimes no live sample had reached. A regime reached by a few (the slower pool's queue of 4-7
requests with 24 live samples and 128 fitted, seed 0) then kept the lead, and at 240-260 s was
served +3.6 over the trees, over-predicting 40-50x. Measured in process with history
(``bench/sim_calibration_replay.py --history``, the step scenarios, seeds 0-3), against that form:
TTFT targets met 51 -> 55 of 88 and pinball lower on 8 of 12; the slower pool's TTFT pinball 292 /
118 / 80.4 / 17.6 -> 22.7 / 72.0 / 86.9 / 16.4 ms; but its seed 3 covers the queued requests 0.734
instead of 0.828 (the lead had covered the queue bins right after the slowdown, too high). Cold it
is identical on all 12 replays and on ``episodes``.
A regime without samples for ``STALE_S`` (or ever) starts from its nearest regime with
recent samples (nearest queue bin first), so a queue that grows into a new bin inherits the
correction of the bin below.

A queue bin whose own tracker has too little recent evidence (fewer than ``min_samples`` samples,
or none for ``STALE_S``) is *served* at least the offset of a bin below it in the same KV bin
(``offsets``; its own tracker keeps tracking its own offset, against which its misses count): a
queue that grows through bins it has seen only in bursts is otherwise predicted with offsets that
the drain after earlier bursts pulled down, just when the bin below shows the pool is slower than
the trees think. Only the bins without their own evidence: bins with enough samples keep their own
offset, also when it is lower (the trees may predict deep queues better than shallow ones: on the
chatbot H200 trace the deepest bins' offsets sit near 0 and the empty queue's at +0.4). Measured in
process (``bench/sim_calibration_replay.py``, the three step scenarios x two seeds under completion
and arrival feedback): TTFT coverage of the queued requests up 0.3-6.8 points on all 12 replays,
TTFT pinball lower on 11 and equal on one; on the H200 traces (``bench/h200_calibration_replay.py``)
no change but chatbot's TTFT (coverage 0.900 -> 0.902, pinball +3 %).
The floor comes from the nearest bin below that holds samples, skipping bins that never had any:
such a bin's offset is the shared part's lead alone, with no evidence behind it. On the chatbot
H200 trace started from its first three stages (``bench/h200_calibration_replay.py
--history-stages 3``), the full cache behind 32 or more waiting, with 17 samples and its own offset
at +0.6, was served +1.6 to +2.7 (7-8x the actual TTFT) through the bins of 1-31 waiting at a full
cache, which no sample had reached. Skipping them took the trace's TTFT pinball from 5,673 to
2,044 ms. Cold, chatbot's TTFT pinball went 1,243 -> 1,188 ms, and the simulator's replays (the
step scenarios and ``episodes``) did not move but for one by under 1 %: a queue that grows reaches
each bin on the way. With history the slower pool's seed 2 lost a lead that had covered it:
86.9 -> 122 ms, coverage 0.897 -> 0.871.

A model not in ``per_regime`` has one offset for every regime, which only ever widens the
trainer's calibration (it is kept at 0 or above); new trees that predict higher take over part of
it (their median change), new trees that predict lower are not widened back (the shift would
otherwise ratchet the widening up with every retrain that learned lower latencies). That suits
TPOT: its sample arrives when the whole request completed, long after the queue it saw, so a
regime's own tracker chases bursts that are over, and one that also narrowed would take back, in
every quiet stretch, the margin the trees keep for the next burst; what it must follow is a change
of the whole pool (slower GPUs), which only ever shows as misses.

When a retrain publishes new trees (``rebase``), each regime's newest ``window`` samples are
scored again with them. A regime with enough samples the new trees were not trained on (newer
than their training data: the trainer holds out the newest samples) gets the conformal offset of
those; any other regime keeps its offset, shifted by the median change of the served margin on its
samples, so a correction the trees have since learned is not applied twice and one they have not
learned is kept. Unless that offset was still short when the new trees came: if it left more of
the regime's held samples uncovered than ``1 - q`` beyond chance (two binomial standard deviations),
the tracker was still catching up with them (a burst into a deep queue or a full KV cache is seen
in a few batches, and the tracker moves by at most ``BATCH_CAP`` samples' worth per batch), and
keeping the served level would keep its shortfall: the new trees, trained on those samples,
predict them higher, and the shift would turn the rest of the correction into a *negative*
offset. Such a regime carries the conformal offset of its held samples instead (the offset that
would have covered them under the old trees), shifted the same way. Measured in process (the
simulator's step scenarios x two seeds under completion and arrival feedback): after a first
burst into a full KV cache the deep regimes' offsets went from +0.4..+0.7 to -0.2..-0.3 at the
next retrain, so the next, deeper burst was covered 0.05-0.4; with the shortfall judged, the
queued requests' TTFT coverage of prompts seed 1 went 0.62 -> 0.88 (arrival feedback) and 0.77 ->
0.90 (completion), overload seed 1's 0.78-0.86 -> 0.87-0.91 (docs/accuracy-history.md, "A
regime whose offset was still short at a retrain"). Trees that replace the prior start from their
own calibration (every offset 0: what the prior's offsets corrected was the prior's guess, not
theirs). Nothing else is reset, so a retrain every second does not throw away what the trackers
have followed.

Not thread-safe: owned by the live-scoring thread.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shared.artifacts import Manifest
from shared.features import NUM_FEATURES
from shared.regimes import RegimeOffsets, RegimeScheme
from training_server.evaluation import conformal_offset

MarginFn = Callable[[np.ndarray], np.ndarray]
# A posted batch counts as at most this many samples: samples that complete together share their
# conditions (a burst), so their errors are one observation, not hundreds.
BATCH_CAP = 8
MIN_SPREAD, MAX_SPREAD = 0.05, 2.0  # bounds of the residual spread the step scales with (log units)
COMMON_SHARE = 1.0  # step of the shared part, relative to a regime's own step
STALE_S = 120.0  # a regime without samples this long starts again from its nearest neighbour
# The shared part's trend term: a velocity that integrates the shared part's moves and leaks per batch.
TREND_GAIN, TREND_LEAK = 0.05, 0.98
MIN_SHORTFALL_ROWS = 10  # fewest rows a regime needs before a rebase may judge its offset short


class _RegimeRings:
    """Newest ``cap`` (features, served margin without regime offsets, residual) rows per regime."""

    def __init__(self, regimes: int, cap: int) -> None:
        self.cap = cap
        self.features = np.zeros((regimes, cap, NUM_FEATURES), dtype=np.float32)
        self.base = np.zeros((regimes, cap))
        self.residual = np.zeros((regimes, cap))
        self.stamp = np.zeros((regimes, cap))  # the samples' timestamps (epoch s)
        self.count = np.zeros(regimes, dtype=np.int64)  # rows held (<= cap)
        self.next = np.zeros(regimes, dtype=np.int64)  # next write position

    def add(
        self, regime: int, features: np.ndarray, base: np.ndarray, residual: np.ndarray, stamp: np.ndarray
    ) -> None:
        n = len(base)
        if n > self.cap:
            features, base, residual, stamp = (a[-self.cap :] for a in (features, base, residual, stamp))
            n = self.cap
        slots = (self.next[regime] + np.arange(n)) % self.cap
        self.features[regime, slots] = features
        self.base[regime, slots] = base
        self.residual[regime, slots] = residual
        self.stamp[regime, slots] = stamp
        self.next[regime] = (self.next[regime] + n) % self.cap
        self.count[regime] = min(self.cap, self.count[regime] + n)

    def held(self, regime: int) -> slice:
        return slice(0, int(self.count[regime]))


class RegimeCalibrator:
    """Per-model, per-regime quantile trackers (see the module docstring)."""

    def __init__(
        self,
        models: tuple[str, ...],
        scheme: RegimeScheme,
        quantile: float,
        window: int,
        min_samples: int,
        steps: dict[str, float],
        per_regime: tuple[str, ...] | None = None,
    ) -> None:
        self.scheme = scheme
        # the models whose regimes' own parts track between retrains (default: all)
        self.per_regime = models if per_regime is None else per_regime
        self.quantile = quantile
        self.min_samples = min_samples
        self.steps = steps  # per model
        self._rings = {name: _RegimeRings(scheme.size, window) for name in models}
        self._common = dict.fromkeys(models, 0.0)  # the part of the offsets every regime shares
        self._velocity = dict.fromkeys(models, 0.0)  # the shared part's trend, per batch
        self._theta = {name: np.zeros(scheme.size) for name in models}  # each regime's own part
        self._seen_s = {name: np.full(scheme.size, -np.inf) for name in models}  # last sample per regime
        self._scored = {name: np.zeros(scheme.size, dtype=np.int64) for name in models}  # samples ever scored
        self.trees: dict[str, str] = {}  # model -> SHA-256 of the trees the offsets are for
        self._prior: dict[str, bool] = {}  # model -> those trees are the prior's

    def observe(
        self,
        model: str,
        features: np.ndarray,
        log_target: np.ndarray,
        base_margin: np.ndarray,
        stamps: np.ndarray,
        now_s: float,
    ) -> None:
        """Samples in arrival order; ``base_margin`` is the served margin of the current trees
        without regime offsets. Moves each regime's tracker, then remembers the rows. A regime
        without samples for ``STALE_S`` (or ever) starts from its nearest neighbour's offset."""
        rings, theta, seen = self._rings[model], self._theta[model], self._seen_s[model]
        regimes = self.scheme.ids(features)
        residual = log_target - base_margin
        common, alpha = self._common[model], 1.0 - self.quantile
        stale = [r for r in np.unique(regimes).tolist() if now_s - seen[r] > STALE_S]
        for regime in stale:
            rings.count[regime] = rings.next[regime] = 0
            theta[regime] = self._neighbour_offset(model, regime, now_s)
        missed = residual > common + theta[regimes]
        # The shared part moves by the batch's pooled error, and each regime of the batch by its
        # own error on top of it: a regime in the batch moves by its own error only, a regime not
        # in it (not seen for a while) follows the batch, so a change that hits every regime (a
        # slower pool) reaches the rarely seen queue bins before their samples do.
        pooled = self.steps[model] * self._spread(rings, None) * min(len(residual), BATCH_CAP)
        pooled *= COMMON_SHARE * (float(np.mean(missed)) - alpha)
        if model in self.per_regime:
            # The trend term: latency that keeps rising (a queue building up) is followed without the
            # lasting shortfall a tracker alone has while it lags behind (see the module docstring).
            self._velocity[model] = TREND_LEAK * self._velocity[model] + TREND_GAIN * pooled
            self._common[model] = common + pooled + self._velocity[model]
        else:
            # A model without regime trackers only ever widens the trainer's calibration (see above).
            self._common[model] = max(0.0, common + pooled)
        self._scored[model] += np.bincount(regimes, minlength=self.scheme.size)
        for regime in np.unique(regimes).tolist():
            rows = np.flatnonzero(regimes == regime)
            seen[regime] = now_s
            weight = self.steps[model] * self._spread(rings, regime) * min(len(rows), BATCH_CAP)
            if model in self.per_regime:
                theta[regime] += weight * (float(np.mean(missed[rows])) - alpha) - pooled
            rings.add(regime, features[rows], base_margin[rows], residual[rows], stamps[rows])

    def _neighbour_offset(self, model: str, regime: int, now_s: float) -> float:
        """The offset of the nearest regime (by queue bin, then KV bin) with recent samples; the
        queue drives latency most, so a queue that grows into a new bin inherits the last one's
        correction. 0 (the trainer's calibration) if no regime has recent samples."""
        kv_bins = len(self.scheme.kv_edges) + 1
        candidates = np.flatnonzero(self._with_evidence(model, now_s))
        if len(candidates) == 0:
            return 0.0
        w, k = divmod(regime, kv_bins)
        distance = np.abs(candidates // kv_bins - w) * kv_bins + np.abs(candidates % kv_bins - k)
        return float(self._theta[model][candidates[np.argmin(distance)]])

    def _with_evidence(self, model: str, now_s: float) -> np.ndarray:
        """The regimes whose own tracker has recent evidence: at least ``min_samples`` samples held,
        the newest within ``STALE_S`` of ``now_s``."""
        recent = self._seen_s[model] >= now_s - STALE_S
        return recent & (self._rings[model].count >= self.min_samples)

    def _spread(self, rings: _RegimeRings, regime: int | None) -> float:
        if regime is not None and rings.count[regime] >= self.min_samples:
            residual = rings.residual[regime, rings.held(regime)]
        else:
            residual = np.concatenate([rings.residual[r, rings.held(r)] for r in range(self.scheme.size)])
        if len(residual) < 2:
            return MAX_SPREAD / 4
        lo, hi = np.quantile(residual, [0.05, 0.95])
        return float(np.clip(hi - lo, MIN_SPREAD, MAX_SPREAD))

    def rebase(
        self,
        model: str,
        trees_sha256: str,
        base_margin: MarginFn,
        unseen_since_s: float,
        prior: bool = False,
        fitted: np.ndarray | None = None,
    ) -> None:
        """New trees (``prior``: the prior's), trained on samples up to ``unseen_since_s``. If the
        old trees were the prior's, every offset starts again from 0: what they corrected was the
        prior's guess, and the trainer's calibration of the new trees already holds. Per regime: a
        regime with at least
        ``min_samples`` newer samples gets the conformal offset of their residuals against the new
        trees (samples the trees never saw, so the offset is not biased low); any other regime
        keeps its offset (or, if it fell short on the regime's held samples beyond chance, their
        conformal offset against the old trees), shifted by the median change of the served margin
        on its samples (old minus new). A model without regime trackers lowers its one offset by how
        much higher the new trees predict (median over all regimes' samples; never below 0, never
        raised). A regime where ``fitted`` (the features the new trees were fitted on) holds more than
        twice as many rows as the trackers ever scored is served the new trees' own calibration:
        its own part cancels the shared part's level (then the shortfall check above applies to it
        as to any kept regime). Then the trackers follow the new trees."""
        self.trees[model] = trees_sha256
        restart, self._prior[model] = self._prior.get(model, False), prior
        rings, theta = self._rings[model], self._theta[model]
        if restart:
            self._common[model] = self._velocity[model] = 0.0
            theta[:] = 0.0
        if fitted is not None and model in self.per_regime and not prior:
            fitted_n = np.bincount(self.scheme.ids(fitted), minlength=self.scheme.size)
            theta[fitted_n > 2 * self._scored[model]] = -self._common[model]
        held = [r for r in range(self.scheme.size) if rings.count[r]]
        if not held:
            return
        parts = [rings.features[r, rings.held(r)] for r in held]
        margin = base_margin(np.ascontiguousarray(np.concatenate(parts)))
        old = np.concatenate([rings.base[r, : len(part)] for r, part in zip(held, parts, strict=True)])
        if model not in self.per_regime:
            # One widening: new trees that predict higher took some of it over; new trees that
            # predict lower learned from the newest samples and are not widened back to the old.
            self._common[model] = max(0.0, self._common[model] + min(0.0, float(np.median(old - margin))))
        start = 0
        for r, part in zip(held, parts, strict=True):
            n = len(part)
            new = margin[start : start + n]
            before, residual = rings.base[r, :n], rings.residual[r, :n]  # against the old trees
            target = before + residual
            # Strictly newer: samples of one posted batch share a stamp, and ties may be trained on.
            unseen = rings.stamp[r, :n] > unseen_since_s
            if model in self.per_regime and np.count_nonzero(unseen) >= self.min_samples:
                theta[r] = conformal_offset((target - new)[unseen], self.quantile) - self._common[model]
            elif model in self.per_regime and not restart:
                own = self._common[model] + theta[r]
                if _fell_short(residual, own, self.quantile):
                    own = conformal_offset(residual, self.quantile)
                theta[r] = own + float(np.median(before - new)) - self._common[model]
            rings.base[r, :n], rings.residual[r, :n] = new, target - new
            start += n

    def trend(self, model: str) -> float:
        """The shared part's trend term: how much it moves per batch by itself (log-latency units)."""
        return self._velocity[model]

    def offsets(self, model: str) -> np.ndarray:
        """The offset of each regime (log-latency units, added to the served margin): its own, or,
        for a queue bin without enough recent samples of its own, at least the offset served to the
        nearest bin below it that holds samples (a bin that never had any has no evidence to pass up:
        its offset is the shared part's lead alone)."""
        own = self._common[model] + self._theta[model]
        if model not in self.per_regime:
            return own
        kv_bins = len(self.scheme.kv_edges) + 1
        newest_s = max(float(np.max(seen)) for seen in self._seen_s.values())  # the latest batch
        young = ~self._with_evidence(model, newest_s).reshape(-1, kv_bins)
        held = (self._scored[model] > 0).reshape(-1, kv_bins)
        served = own.reshape(-1, kv_bins).copy()
        floor = np.where(held[0], served[0], -np.inf)  # per KV bin: the nearest held bin below's
        for w in range(1, len(served)):
            served[w] = np.where(young[w], np.maximum(served[w], floor), served[w])
            floor = np.where(held[w], served[w], floor)
        return served.reshape(-1)

    def proposal(self, current: Manifest) -> tuple[dict[str, RegimeOffsets], float]:
        """New offsets for the models whose trees the calibrator tracks, and the largest move
        from ``current``'s published offsets."""
        new: dict[str, RegimeOffsets] = {}
        moved = 0.0
        for name, spec in current.models.items():
            if name not in self._rings or self.trees.get(name) != spec.sha256:
                continue  # not tracking these trees yet
            offsets = self.offsets(name)
            old = np.zeros(self.scheme.size)
            if spec.regime_offsets is not None and spec.regime_offsets.scheme == self.scheme:
                old = np.asarray(spec.regime_offsets.offsets)
            moved = max(moved, float(np.max(np.abs(offsets - old))))
            new[name] = RegimeOffsets.of(self.scheme, np.round(offsets, 6))
        return new, moved

    def samples(self, model: str) -> np.ndarray:
        return self._rings[model].count.copy()


def _fell_short(residual: np.ndarray, offset: float, quantile: float) -> bool:
    """Whether ``offset`` left more than a share ``1 - quantile`` of ``residual`` uncovered beyond
    chance: by more than two binomial standard deviations, with at least ``MIN_SHORTFALL_ROWS`` rows."""
    n = len(residual)
    excess = np.count_nonzero(residual > offset) - n * (1.0 - quantile)
    return n >= MIN_SHORTFALL_ROWS and excess > 2.0 * np.sqrt(n * quantile * (1.0 - quantile))
