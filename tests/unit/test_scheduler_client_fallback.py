"""The fallback switch as a state machine (time passed in by hand) and its configuration."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from scheduler_client import ClientConfig, CompositeWeights, FallbackPolicy, FeederConfig, Mode
from scheduler_client.fallback import FallbackSwitch


def test_needs_consecutive_failures_to_fall_back() -> None:
    switch = FallbackSwitch(FallbackPolicy(failures_to_fallback=3))
    switch.record_failure(0.0)
    switch.record_failure(0.1)
    switch.record_success()  # resets the streak
    switch.record_failure(0.2)
    switch.record_failure(0.3)
    assert switch.mode is Mode.PREDICTED and switch.should_predict()
    switch.record_failure(0.4)
    assert switch.mode is Mode.FALLBACK and not switch.should_predict()
    assert switch.switches_to_fallback == 1


def test_probes_are_rate_limited_and_one_at_a_time() -> None:
    switch = FallbackSwitch(FallbackPolicy(probe_interval_s=1.0))
    assert not switch.try_start_probe(0.0)  # predicted mode: nothing to probe
    switch.record_failure(10.0)
    assert not switch.try_start_probe(10.5)  # a full interval after the failure first
    assert switch.try_start_probe(11.0)
    assert not switch.try_start_probe(13.0)  # still in flight
    switch.record_failure(13.1)
    switch.probe_finished()
    assert not switch.try_start_probe(11.9)
    assert switch.try_start_probe(13.2)  # the interval counts from the previous probe's start
    assert switch.probes_started == 2


def test_recovery_needs_consecutive_successes() -> None:
    switch = FallbackSwitch(FallbackPolicy(successes_to_recover=2))
    switch.record_failure(0.0)
    switch.record_success()
    switch.record_failure(1.0)
    switch.record_success()
    assert switch.mode is Mode.FALLBACK
    switch.record_success()
    assert switch.mode is Mode.PREDICTED and switch.switches_to_predicted == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: FallbackPolicy(failures_to_fallback=0),
        lambda: FallbackPolicy(probe_interval_s=-1),
        lambda: CompositeWeights(0, 0, 0),
        lambda: CompositeWeights(prefix=-1),
        lambda: FeederConfig(batch_size=1001),
        lambda: FeederConfig(max_buffered=0),
        lambda: FeederConfig(backoff_initial_s=2, backoff_max_s=1),
        lambda: ClientConfig(predict_timeout_s=0),
    ],
)
def test_invalid_settings_fail_fast(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        make()
