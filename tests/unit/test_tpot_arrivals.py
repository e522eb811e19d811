"""bench.tpot_arrivals: the arrival rate each decode saw, aligned with its TPOT."""

from __future__ import annotations

import numpy as np

from bench.tpot_arrivals import arrival_rates


def test_busier_decodes_are_slower_at_the_same_running_count() -> None:
    r = arrival_rates(seed=0, pods=4, rate_rps=40.0, duration_s=30.0)
    n = len(r["tpot_ms"])
    assert n > 500 and len(r["running"]) == len(r["rate"]) == n
    assert (r["tpot_ms"] > 0).all() and (r["rate"] >= 0).all()
    band = (r["running"] >= 8) & (r["running"] < 16)
    assert band.sum() >= 50
    tpot, rate = r["tpot_ms"][band], r["rate"][band]
    calm = tpot[rate <= np.percentile(rate, 100 / 3)]
    busy = tpot[rate >= np.percentile(rate, 200 / 3)]
    # Prefills of what arrives meanwhile lengthen every decode step: no routing-time feature shows it.
    assert np.percentile(busy, 90) > 1.2 * np.percentile(calm, 90)
    assert np.corrcoef(rate, tpot)[0, 1] > 0.3
