"""Fitting the work-ahead baseline of ``shared.baseline`` (a linear quantile regression, numpy only).

The baseline is ``intercept + sum(slope_j * work_j)`` with non-negative slopes (more work ahead
never makes a request faster), fitted at the model's quantile by minimising the pinball loss with
iteratively reweighted least squares: each step solves a weighted least-squares problem whose
weights ``q / |r|`` (above) and ``(1 - q) / |r|`` (below the fit) make its squared loss equal the
pinball loss at the previous residuals ``r``; a slope that comes out negative is pinned to zero
for that step (active set). Features are scaled to unit maximum for the solver and the slopes
scaled back. The fit runs on an evenly spaced subsample of at most ``FIT_ROWS`` rows: a handful
of coefficients needs no more, and it costs tens of milliseconds however large the window.

Measured on 50,000 synthetic rows (2 busy cores): 20 IRLS steps on all rows took 0.31 s and reached
a pinball loss within 1 % of an exact linear programme (HiGHS), which took 0.2 s for 1,000 rows,
0.5 s for 2,000 and 2.1 s for 4,000; scikit-learn's ``QuantileRegressor`` solves the same
programme (without the sign constraint).

A linear baseline keeps growing with the work, which is right for work that queues (TTFT behind
a deeper queue) and wrong where the latency saturates: the decode step of a memory-bound GPU (on
the bimodal H200 trace, TPOT rises from 26 to 36 ms up to 34 running requests, then stays at
37-39 ms up to 393). A line fitted where TPOT still rises overshoots beyond that, and the trees
cannot bend it back: their monotone constraints (more running work never lowers TPOT) hold for
their log-ratio to the baseline, which would have to fall. So TPOT's baseline may bend: each
feature enters once as it is and once capped at each of several knees (quantiles of its fit
rows, ``KNEE_LEVELS``), every slope non-negative: a concave, non-decreasing line whose slope falls
at each knee, to 0 where TPOT saturates (as on the traces), and whose slope beyond the last
knee is what the rows there show. The trainer passes its held-out samples, the newest, and the
bent baseline replaces the linear one only if it predicts them better with the guard's confidence
(at least ``MIN_NEWEST`` of them). All of them judge, not only those beyond the fitted range: a
line fitted through a rise and its plateau is too high on both ends of the plateau, inside the
range too (on the chatbot H200 trace, in process, the line predicted TPOT 62-67 ms against 52-53
ms measured for the first 500 requests after the trained models took over: coverage 0.997 at 8
QPS; judged by all the newest rows the bend was taken, and 0.962). Where the newest rows show
no saturation (TPOT growing with the work, as in the simulator) the line stays, and the first
overload beyond the range is extrapolated as growing, the side that errs towards covering it.
The guard then scores the candidate on the same held-out samples, with one of two baselines
picked on them: a small optimism its tolerance for equal models absorbs.

Some work costs a decode step at most a budget's worth, however much of it is queued: a step
prefills at most its token budget (vLLM's ``max_num_batched_tokens``, with chunked prefill), and
a request waiting behind a full KV cache is not prefilled at all. So TPOT grows with the prefill
in flight only up to some amount, while ``prefill_tokens_in_flight`` counts every waiting prompt in
full, and a line through it extrapolated a deep queue's prefill into a TPOT several times what
those requests saw (the simulator over HTTP, prompts seed 2: at 32 or more waiting, TPOT's
pinball 5.6 ms against the naive baseline's 1.1 ms; covered 0.956). A ``BOUNDED`` feature's term
is therefore capped at the largest value of its fit rows: linear wherever samples have shown it,
flat beyond (as the trees are), in every baseline of that model; a fit with no such work at all
leaves it uncapped, slope 0. Measured in process (``bench/sim_calibration_replay.py --seeds 0 1 2
3 --train-s 0.4``, both feedback protocols): TPOT's pinball lower on all 24 replays (prompts
seed 2: 3.25 -> 1.38 ms), its coverage within 0.74 points, TTFT unchanged, targets met 34 -> 34
and 48 -> 48; on the H200 traces bimodal's TPOT pinball 0.53 -> 0.46 ms.

TTFT's work ahead costs more once the KV cache is nearly full: the queue then waits for running
requests to finish and free their cache, not only for prefill compute. In the simulator's step
scenarios, a request behind 16 or more waiting requests (the cache 0.98 full) waited 53-177 ms
per thousand tokens ahead against 25-65 ms behind 1-3 (cache 0.35-0.43 full). So TTFT's baseline
may take ``KV_SCALED`` terms: the prefill work ahead times ``max(kv_cache_percentage - k, 0)`` for
each ``k`` in ``KV_KNEES``, slopes non-negative like the others (``shared.baseline``'s scaled
kind). Fitted on the rows with fewer than 8 waiting requests only, the linear baseline covered
0.00-0.01 of the rows at 16 or more waiting at its 0.9 quantile; with these terms 0.54-0.91 (the
six scenario x seed replays, ``bench.accuracy_steps``). But always on, they cost the real traces
over HTTP (sharegpt's TTFT pinball 1.18-1.22x the naive baseline's in two runs, against
0.50-0.55, from early models on a few hundred samples; chatbot's TTFT coverage 0.870-0.888):
where the cache's use says little of the wait, its terms fit noise. So they are an alternative
like the bend, taken only when the newest held-out rows (at least ``MIN_NEWEST``) show with the
guard's confidence that they predict better. Unlike the bend, the terms change the baseline
within the fitted range too, so all the newest rows judge them, not only those beyond it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from shared.baseline import BASELINE_KIND, PIECEWISE_KIND, SCALED_KIND, WORK_FEATURES, baseline_ms
from shared.features import FEATURE_NAMES
from shared.regimes import DEFAULT_SCHEME
from training_server.evaluation import compare_paired, pinball_loss

FIT_ROWS = 10_000
IRLS_STEPS = 30
# Work a decode step processes at most a budget of (see the module docstring), per model: its
# term is capped at the largest value of the fit rows.
BOUNDED: dict[str, frozenset[str]] = {"tpot": frozenset({"prefill_tokens_in_flight"})}
# Models whose latency may stop growing with the work (a memory-bound decode step: TPOT). TTFT
# waits for the work queued ahead of it, which adds up without bound: its baseline stays linear.
SATURATING = frozenset({"tpot"})
KNEE_LEVELS = (0.2, 0.4, 0.6, 0.8, 0.95)  # the bent baseline's knees: quantiles of its fit rows
KNEE_FIT_ROWS = 3_000  # rows the bent baseline is fitted on (its design has 6x the columns)
MIN_NEWEST = 50  # newest rows needed to judge an alternative baseline against the linear one
# Per model, the work whose cost per token grows as the KV cache fills, scaled by the cache's use
# beyond each knee: 0 (a term proportional to the use itself) and where the regimes call the
# cache nearly full (shared.regimes).
KV_SCALED: dict[str, str] = {"ttft": "prefill_work_tokens"}
KV_FEATURE = "kv_cache_percentage"
KV_KNEES = (0.0, *DEFAULT_SCHEME.kv_edges)
# A KV-scaled term is fitted only where it is non-zero on this share of the fit rows (and at least
# MIN_NEWEST of them): fitted on a handful, IRLS can give it a slope that fits those few exactly
# and explodes beyond them (seen over HTTP: TTFT predictions of hours behind the slower pool).
KV_MIN_SHARE = 0.05
_NO_CAP = 3.0e38  # an upper bound no feature reaches (finite, for the manifest's JSON)


def fit_baseline(
    model: str,
    features: np.ndarray,
    latency_ms: np.ndarray,
    quantile: float,
    newest: tuple[np.ndarray, np.ndarray] | None = None,
    confidence: float = 0.95,
    *,
    bend: bool,
    kv_scaled: bool,
) -> dict[str, Any] | None:
    """The baseline description for ``model`` fitted on these rows, or ``None`` if there are none.

    The linear baseline, unless an alternative predicts ``newest`` (feature rows and latencies
    newer than the fit rows) better with ``confidence`` (paired comparison, as the publish guard
    does). With ``bend``, for a model in ``SATURATING``: the concave one bent at ``KNEE_LEVELS``
    of its features. Then, with ``kv_scaled``, for a model in ``KV_SCALED``: the one with the
    KV-scaled terms, against the choice so far. Each alternative is judged on all the newest rows
    (at least ``MIN_NEWEST``).
    """
    if len(latency_ms) == 0:
        return None
    fit_rows, y = _fit_rows(features, latency_ms)
    chosen = _fit(model, fit_rows, y, quantile)
    if newest is None or len(newest[1]) < MIN_NEWEST:
        return chosen
    for alternative in _alternatives(model, fit_rows, y, quantile, bend=bend, kv_scaled=kv_scaled):
        chosen = _better(alternative, chosen, *newest, quantile, confidence)
    return chosen


def widest_baseline(
    model: str, features: np.ndarray, latency_ms: np.ndarray, quantile: float
) -> dict[str, Any] | None:
    """``model``'s baseline with every term ``fit_baseline`` may choose for it (bent, or KV-scaled
    at each supported knee), taken without judging it: the most a served version's baseline asks
    of the prediction path (``bench/prediction_load.py`` serves it). ``None`` without rows."""
    if len(latency_ms) == 0:
        return None
    fit_rows, y = _fit_rows(features, latency_ms)
    fits = [_fit(model, fit_rows, y, quantile)]
    fits += _alternatives(model, fit_rows, y, quantile, bend=True, kv_scaled=True)
    return fits[-1]


def _fit_rows(features: np.ndarray, latency_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At most ``FIT_ROWS`` evenly spaced rows and their latencies (float64)."""
    n = len(latency_ms)
    rows = np.unique(np.linspace(0, n - 1, min(n, FIT_ROWS)).astype(np.int64))
    return features[rows], latency_ms[rows].astype(np.float64)


def _alternatives(
    model: str, fit_rows: np.ndarray, y: np.ndarray, quantile: float, *, bend: bool, kv_scaled: bool
) -> Iterator[dict[str, Any]]:
    """The alternatives to ``model``'s linear baseline, each fitted only when asked for: with
    ``bend``, for a model in ``SATURATING``, the concave one bent at ``KNEE_LEVELS`` of its
    features; then, with ``kv_scaled``, for a model in ``KV_SCALED``, the one with the KV-scaled
    terms at its supported knees."""
    if bend and model in SATURATING:
        names = WORK_FEATURES[model]
        x = fit_rows[:, [FEATURE_NAMES.index(name) for name in names]].astype(np.float64)
        knees = np.quantile(x, KNEE_LEVELS, axis=0).astype(np.float32).astype(np.float64)
        few = np.unique(np.linspace(0, len(y) - 1, min(len(y), KNEE_FIT_ROWS)).astype(np.int64))
        yield _fit(model, fit_rows[few], y[few], quantile, knees)
    kv_knees = _supported_kv_knees(model, fit_rows) if kv_scaled else ()
    if kv_knees:
        yield _fit(model, fit_rows, y, quantile, kv_knees=kv_knees)


def _supported_kv_knees(model: str, features: np.ndarray) -> tuple[float, ...]:
    """The ``KV_KNEES`` at which ``model``'s ``KV_SCALED`` term is non-zero on enough of these fit
    rows (``KV_MIN_SHARE``, at least ``MIN_NEWEST``); none for a model without such a term."""
    work_name = KV_SCALED.get(model)
    if work_name is None:
        return ()
    work = features[:, FEATURE_NAMES.index(work_name)]
    kv = features[:, FEATURE_NAMES.index(KV_FEATURE)].astype(np.float64)
    support = max(MIN_NEWEST, KV_MIN_SHARE * len(features))
    return tuple(k for k in KV_KNEES if np.count_nonzero((kv > k) & (work > 0)) >= support)


def _better(
    alternative: dict[str, Any],
    chosen: dict[str, Any],
    features: np.ndarray,
    latency_ms: np.ndarray,
    quantile: float,
    confidence: float,
) -> dict[str, Any]:
    """``alternative`` if it predicts these rows better than ``chosen`` with ``confidence``."""
    decision = compare_paired(
        _relative_losses(alternative, features, latency_ms, quantile),
        _relative_losses(chosen, features, latency_ms, quantile),
        confidence,
    )
    return alternative if decision.verdict == "better" else chosen


def _fit(
    model: str,
    features: np.ndarray,
    y: np.ndarray,
    quantile: float,
    knees: np.ndarray | None = None,
    kv_knees: tuple[float, ...] = (),
) -> dict[str, Any]:
    """``model``'s linear baseline on these ``build_features`` rows, with its ``KV_SCALED`` term
    scaled from each of ``kv_knees``; or, with ``knees`` (levels x work features), the concave one:
    each feature enters once as it is and once capped at each of its (positive, distinct) knees,
    every slope non-negative, so the slope falls at each knee it passes, to 0 where the latency
    saturates. A ``BOUNDED`` feature's own term is capped at its largest value on these rows."""
    names = WORK_FEATURES[model]
    x = features[:, [FEATURE_NAMES.index(name) for name in names]].astype(np.float64)
    # Relative pinball loss: each row weighs 1 / latency, so the slopes fit the typical request
    # rather than the few slowest ones (the trees correct the log-ratio around it).
    relative = _relative(y)
    capped = (
        sorted({(j, float(k)) for level in knees for j, k in enumerate(level) if k > 0})
        if knees is not None
        else []
    )
    # A BOUNDED feature's own term stops at the largest value of these rows (none: uncapped).
    top = x.max(axis=0, initial=0.0)
    bounds = [
        float(np.float32(top[j])) if name in BOUNDED.get(model, ()) and top[j] > 0 else _NO_CAP
        for j, name in enumerate(names)
    ]
    columns = [np.minimum(x[:, j], k) for j, k in capped] + [
        np.minimum(x[:, j], b) for j, b in enumerate(bounds)
    ]
    terms: list[tuple[str, float, str | None, float]] = [(names[j], k, None, 0.0) for j, k in capped]
    terms += [(name, bound, None, 0.0) for name, bound in zip(names, bounds, strict=True)]
    if kv_knees:
        scaled_work = KV_SCALED[model]
        work = features[:, FEATURE_NAMES.index(scaled_work)].astype(np.float64)
        kv = features[:, FEATURE_NAMES.index(KV_FEATURE)].astype(np.float64)
        columns += [work * np.maximum(kv - knee, 0.0) for knee in kv_knees]
        terms += [(scaled_work, _NO_CAP, KV_FEATURE, knee) for knee in kv_knees]
    intercept, slopes = quantile_regression_nonneg(np.column_stack(columns), y, quantile, relative)
    bounded = any(cap < _NO_CAP for _, cap, _, _ in terms)
    kind = SCALED_KIND if kv_knees else PIECEWISE_KIND if bounded else BASELINE_KIND
    baseline: dict[str, Any] = {
        "kind": kind,
        "features": [name for name, _, _, _ in terms],
        "intercept": intercept,
        "coefficients": [float(v) for v in slopes],
    }
    if kind != BASELINE_KIND:
        # float32 knees, as the features are: the cap is applied to build_features' matrix
        baseline["upper"] = [cap for _, cap, _, _ in terms]
    if kind == SCALED_KIND:
        baseline["scale_features"] = [scale for _, _, scale, _ in terms]
        baseline["scale_from"] = [knee for _, _, _, knee in terms]
    return baseline


def baseline_form(baseline: dict[str, Any] | None) -> str | None:
    """How a fitted baseline goes on beyond its fit range: "linear", "bent" (it saturates: a feature
    enters more than once, capped at knees), "kv-scaled" (it grows faster once the KV cache is
    full). A linear baseline whose ``BOUNDED`` work is capped at its fit range is linear."""
    if baseline is None:
        return None
    if baseline["kind"] == SCALED_KIND:
        return "kv-scaled"
    features = baseline["features"]
    return "bent" if len(set(features)) < len(features) else "linear"


def _relative_losses(
    baseline: dict[str, Any], features: np.ndarray, latency_ms: np.ndarray, q: float
) -> np.ndarray:
    """Per-row pinball loss of the baseline alone, relative to the latency (as it is fitted)."""
    return pinball_loss(latency_ms, baseline_ms(features, baseline), q) * _relative(latency_ms)


def _relative(latency_ms: np.ndarray) -> np.ndarray:
    """Each row's weight 1 / latency (floored at 1 % of the median: a near-zero latency does not
    dominate)."""
    return 1.0 / np.maximum(latency_ms, max(1e-3, 0.01 * float(np.median(latency_ms))))


def quantile_regression_nonneg(
    x: np.ndarray,
    y: np.ndarray,
    quantile: float,
    sample_weight: np.ndarray | None = None,
    steps: int = IRLS_STEPS,
) -> tuple[float, np.ndarray]:
    """Intercept and non-negative slopes minimising the (weighted) mean pinball loss of ``y ~ x`` (IRLS)."""
    n, k = x.shape
    scale = np.maximum(np.abs(x).max(axis=0, initial=0.0), 1e-12)
    design = np.column_stack((np.ones(n), x / scale))
    floor = max(1e-9, 1e-3 * float(np.median(np.abs(y))))  # residuals below this weigh as this
    beta = np.zeros(k + 1)
    beta[0] = float(np.quantile(y, quantile))
    for _ in range(steps):
        residual = y - design @ beta
        weight = np.where(residual > 0, quantile, 1.0 - quantile) / np.maximum(np.abs(residual), floor)
        if sample_weight is not None:
            weight = weight * sample_weight
        beta = _nonneg_weighted_lstsq(design, y, weight)
    slopes = beta[1:] / scale
    if not np.isfinite(beta).all():
        return float(np.quantile(y, quantile)), np.zeros(k)
    return float(beta[0]), slopes


def _nonneg_weighted_lstsq(design: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Weighted least squares with the intercept free and every slope >= 0 (drop the most negative)."""
    active = np.ones(design.shape[1], dtype=bool)
    while True:
        a = design[:, active]
        weighted = (a * weight[:, None]).T
        solved = np.linalg.lstsq(weighted @ a, weighted @ y, rcond=None)[0]
        beta = np.zeros(design.shape[1])
        beta[active] = solved
        negative = np.flatnonzero(beta[1:] < 0) + 1
        if len(negative) == 0:
            return beta
        active[negative[np.argmin(beta[negative])]] = False
