"""The store watcher: follows CURRENT, refuses bad versions, pulls over HTTP, falls back to the prior."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from prediction_server.config import PredictionSettings
from prediction_server.metrics import PredictionMetrics
from prediction_server.predictor import BUILTIN_PRIOR_VERSION
from prediction_server.store_watcher import STARTUP_STORE_BUDGET_S, StoreWatcher
from shared.artifacts import Manifest
from shared.metrics import new_registry
from shared.model_store import ModelStore
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets
from tests.prediction_support import (
    point_current,
    publish_corrupt,
    publish_trained,
    serve_store_over_http,
    tamper,
)


def _watcher(store: str, **settings: Any) -> StoreWatcher:
    return StoreWatcher(PredictionSettings(store=store, **settings), PredictionMetrics(new_registry()))


def _refusals(watcher: StoreWatcher) -> float:
    return sum(
        sample.value
        for metric in watcher.metrics.refused.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


async def test_empty_store_serves_the_prior_then_switches_to_a_published_version(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    watcher = _watcher(str(store.root))
    await watcher.start()
    try:
        assert watcher.current is not None and watcher.current.version == BUILTIN_PRIOR_VERSION
        assert watcher.store_reachable is True
        manifest = publish_trained(store, seed=1)
        assert await watcher.check() is True
        assert watcher.current.version == manifest.version and watcher.current.kind == "trained"
        assert await watcher.check() is False  # nothing new
    finally:
        await watcher.stop()


async def test_a_corrupt_version_is_refused_once_and_the_previous_keeps_serving(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    good = publish_trained(store, seed=1)
    watcher = _watcher(str(store.root))
    await watcher.start()
    try:
        assert watcher.current is not None and watcher.current.version == good.version
        bad = publish_corrupt(store, seed=2)
        assert await watcher.check() is False
        assert watcher.current.version == good.version
        assert "checksum mismatch" in watcher.refused[bad.version]
        assert _refusals(watcher) == 1
        # Remembered: later polls neither re-read nor re-count it.
        for _ in range(3):
            assert await watcher.check() is False
        assert _refusals(watcher) == 1
        # A newer good version is taken as usual.
        newer = publish_trained(store, seed=3)
        assert await watcher.check() is True and watcher.current.version == newer.version
        # /reload forgets refusals, so a rolled-back-to corrupt version is examined (and refused) again.
        point_current(store, bad.version)
        assert await watcher.reload() is False
        assert _refusals(watcher) == 2 and watcher.current.version == newer.version
    finally:
        await watcher.stop()


async def test_tampering_with_an_old_version_is_caught_on_rollback(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    old = publish_trained(store, seed=1)
    new = publish_trained(store, seed=2)
    watcher = _watcher(str(store.root))
    await watcher.start()
    try:
        assert watcher.current is not None and watcher.current.version == new.version
        tamper(store, old.version, "tpot.ubj")
        point_current(store, old.version)
        assert await watcher.check() is False
        assert watcher.current.version == new.version and old.version in watcher.refused
    finally:
        await watcher.stop()


async def test_a_corrupt_only_version_leaves_the_prior_serving(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    bad = publish_corrupt(store, seed=1)
    watcher = _watcher(str(store.root))
    await watcher.start()
    try:
        assert watcher.current is not None and watcher.current.version == BUILTIN_PRIOR_VERSION
        assert bad.version in watcher.refused
    finally:
        await watcher.stop()


async def test_without_prior_fallback_nothing_answers_until_a_version_exists(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    watcher = _watcher(str(store.root), prior_fallback=False)
    await watcher.start()
    try:
        assert watcher.current is None
        publish_trained(store, seed=1)
        assert await watcher.check() is True and watcher.current is not None
    finally:
        await watcher.stop()


async def test_a_vanished_version_is_retried_not_refused(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    good = publish_trained(store, seed=1)
    watcher = _watcher(str(store.root))
    await watcher.start()
    try:
        point_current(store, "000099-trained")  # e.g. pruned between reading CURRENT and the files
        assert await watcher.check() is False
        assert watcher.refused == {} and watcher.store_reachable is False
        assert watcher.current is not None and watcher.current.version == good.version
        point_current(store, good.version)
        await watcher.check()
        assert watcher.store_reachable is True
    finally:
        await watcher.stop()


async def test_pulls_and_verifies_versions_over_http(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    cache = tmp_path / "cache"
    with serve_store_over_http(store.root) as url:
        watcher = _watcher(url, cache_dir=str(cache))
        await watcher.start()
        try:
            assert watcher.current is not None and watcher.current.version == BUILTIN_PRIOR_VERSION
            assert watcher.store_reachable is True  # 404 on /models/current = nothing published yet
            first = publish_trained(store, seed=1)
            assert await watcher.check() is True and watcher.current.version == first.version
            bad = publish_corrupt(store, seed=2)
            assert await watcher.check() is False
            assert watcher.current.version == first.version and bad.version in watcher.refused
        finally:
            await watcher.stop()
    # The verified version was cached; the corrupt one was not.
    assert ModelStore(cache).current_version() == first.version
    assert ModelStore(cache).versions() == [first.version]


async def test_a_calibration_version_is_pulled_as_its_manifest_and_cached_as_links(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    cache = ModelStore(tmp_path / "cache")
    requested: list[str] = []
    with serve_store_over_http(store.root, requested) as url:
        watcher = _watcher(url, cache_dir=str(cache.root))
        await watcher.start()
        try:
            trained = publish_trained(store, seed=1)
            assert await watcher.check() is True and watcher.current.version == trained.version
            offsets = RegimeOffsets.of(DEFAULT_SCHEME, np.full(DEFAULT_SCHEME.size, 0.1))
            calibrated = store.publish_calibrated(trained.version, {"ttft": offsets}, {})
            assert calibrated is not None
            assert await watcher.check() is True and watcher.current.version == calibrated.version
            assert watcher.current.forests is not None and watcher.current.manifest == calibrated
        finally:
            await watcher.stop()
    downloads = [path for path in requested if path.endswith(".ubj")]
    assert sorted(downloads) == [f"/models/versions/{trained.version}/{f}" for f in ("tpot.ubj", "ttft.ubj")]
    assert cache.current_version() == calibrated.version and cache.load().manifest == calibrated
    for spec in calibrated.models.values():
        linked = os.stat(cache.versions_dir / calibrated.version / spec.file)
        assert linked.st_ino == os.stat(cache.versions_dir / trained.version / spec.file).st_ino


async def test_an_unreachable_http_store_serves_the_cached_version_else_the_prior(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    cache = tmp_path / "cache"
    first = publish_trained(store, seed=1)
    with serve_store_over_http(store.root) as url:
        watcher = _watcher(url, cache_dir=str(cache))
        await watcher.start()
        await watcher.stop()
    # The training server is gone now (its port is closed).
    watcher = _watcher(url, cache_dir=str(cache), store_timeout_s=1.0)
    await watcher.start()
    try:
        assert watcher.store_reachable is False
        assert watcher.current is not None and watcher.current.version == first.version
    finally:
        await watcher.stop()
    shutil.rmtree(cache)
    watcher = _watcher(url, cache_dir=str(cache), store_timeout_s=1.0)
    await watcher.start()
    try:
        assert watcher.current is not None and watcher.current.version == BUILTIN_PRIOR_VERSION
    finally:
        await watcher.stop()


def test_manifests_with_extra_fields_or_wrapped_are_accepted_bad_names_are_not(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    manifest = publish_trained(store, seed=1)
    data = orjson.loads(manifest.to_json())
    assert Manifest.from_json(orjson.dumps({**data, "added_later": 1})) == manifest
    assert Manifest.from_json(orjson.dumps({"version": manifest.version, "manifest": data})) == manifest
    with pytest.raises(Exception, match="bad version name"):
        Manifest.from_json(orjson.dumps({**data, "version": "../escape"}))


async def test_a_store_that_never_answers_does_not_hold_up_readiness() -> None:
    with socket.socket() as silent:  # accepts connections (backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        watcher = _watcher(f"http://127.0.0.1:{silent.getsockname()[1]}", store_timeout_s=30.0)
        started = time.monotonic()
        await watcher.start()
        try:
            assert time.monotonic() - started < STARTUP_STORE_BUDGET_S + 1.5
            assert watcher.current is not None and watcher.current.version == BUILTIN_PRIOR_VERSION
            assert watcher.store_reachable is False
        finally:
            await watcher.stop()
