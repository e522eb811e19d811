"""Background prediction load for e2e fault tests: one thread per replica, every failure kept."""

from __future__ import annotations

import random
from typing import Any

import httpx
import orjson

from tests.load import LoadThreads


class Predicting(LoadThreads):
    """One thread per URL calling ``/predict/bulk/strict`` back to back with ``rows``.

    ``errors`` collects every failed call; ``versions[url]`` lists the ``model_version`` of every
    prediction answered, in order.
    """

    def __init__(self, urls: list[str], rows: list[dict[str, Any]]) -> None:
        super().__init__(threads=len(urls))
        self.urls = urls
        self.versions: dict[str, list[str]] = {url: [] for url in urls}
        self._body = orjson.dumps({"requests": rows})

    def step(self, client: httpx.Client, worker: int) -> None:
        url = self.urls[worker]
        try:
            response = client.post(url + "/predict/bulk/strict", content=self._body)
        except httpx.HTTPError as exc:
            self.errors.append(f"{url}: {exc!r}")
            return
        if response.status_code != 200:
            self.errors.append(f"{url}: {response.status_code} {response.text[:200]}")
            return
        self.versions[url].extend(p["model_version"] for p in response.json()["predictions"])
        self.pause(0.005)


def random_row(rng: random.Random) -> dict[str, Any]:
    """A valid prediction row with varied features (every pod type)."""
    return {
        "kv_cache_percentage": round(rng.random(), 3),
        "input_token_length": rng.randint(1, 8000),
        "num_request_waiting": rng.randint(0, 20),
        "num_request_running": rng.randint(0, 64),
        "num_tokens_generated": 1,
        "prefix_cache_score": round(rng.random(), 3),
        "pod_type": rng.choice(["", "prefill", "decode"]),
    }
