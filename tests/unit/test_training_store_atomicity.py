"""A reader of the model store never sees an error or a half-written version while the
training server publishes (the same ``ModelStore.publish`` the trainer uses)."""

from __future__ import annotations

import threading
from pathlib import Path

import xgboost as xgb

from shared.model_store import ModelStore
from shared.prior import build_prior_models


def test_reader_never_sees_a_partial_version_while_the_writer_publishes(tmp_path: Path) -> None:
    models, transforms = build_prior_models(0.9)
    store = ModelStore(tmp_path / "models", keep_versions=4)
    store.publish("prior", models, objective="quantile", quantile=0.9, target_transforms=transforms)
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: set[str] = set()
    loads = 0

    def reader() -> None:
        nonlocal loads
        while not stop.is_set():
            try:
                model_set = store.load()  # reads CURRENT, the manifest, both files; verifies SHA-256
                if model_set.manifest.version not in seen:  # a new version must also parse as a model
                    for data in model_set.files.values():
                        xgb.Booster().load_model(bytearray(data))
                seen.add(model_set.manifest.version)
                loads += 1
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for i in range(40):
            # Every version gets different file bytes, so mixing two versions fails the checksum.
            varied = {}
            for name, data in models.items():
                booster = xgb.Booster()
                booster.load_model(bytearray(data))
                booster.set_attr(publish_iteration=str(i))
                varied[name] = bytes(booster.save_raw("ubj"))
            store.publish(
                "trained",
                varied,
                objective="quantile",
                quantile=0.9,
                target_transforms=transforms,
                calibration_offsets={"ttft": i / 100, "tpot": -i / 100},
                metrics={"iteration": i},
            )
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not errors, errors[0]
    assert loads > 40 and len(seen) > 5
    assert store.current_version() == store.versions()[-1]
    assert len(store.versions()) == 4  # pruned, keeping a few for rollback
    assert not list(store.root.glob(".staging-*"))
