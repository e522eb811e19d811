"""Recently accepted ``Idempotency-Key`` values, so a resent batch is acknowledged, not re-inserted.

A sender (the coalescer's relay) puts one key on each batch and resends with the same key after
a timeout. The first request to claim a key (before it reads its body) inserts its samples; any
other request with that key, also one that arrives while the first is still uploading or
journalling, waits for it and answers the same 202, inserting nothing. Keys are kept for
``ttl_s`` (default 10 minutes) and at most ``max_keys`` (default 100,000), oldest dropped first.
They survive a ``kill -9``: each key is in the journal record of its batch and in the window
snapshot.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import numpy as np

MAX_KEY_LENGTH = 200
Outcome = tuple[int, int]
Claim = asyncio.Future[Outcome]  # held by the one request committing a key; settled with its outcome


class RecentKeys:
    """Bounded map key -> (accepted at, samples acknowledged, of which stale), plus the keys being
    committed now. ``Outcome`` = (acknowledged, stale) is what the resend is answered."""

    def __init__(self, ttl_s: float = 600.0, max_keys: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._keys: OrderedDict[str, tuple[float, Outcome]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[Outcome]] = {}
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, key: str, now_s: float) -> Outcome | None:
        """The outcome of an accepted, unexpired key, else ``None``."""
        entry = self._keys.get(key)
        if entry is None or entry[0] < now_s - self.ttl_s:
            return None
        return entry[1]

    def inflight(self, key: str) -> Claim | None:
        return self._inflight.get(key)

    def begin(self, key: str) -> Claim:
        future: Claim = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        return future

    def end(self, key: str, future: Claim) -> None:
        if self._inflight.get(key) is future:
            del self._inflight[key]
        if not future.done():
            future.cancel()

    def add(self, key: str, accepted_at: float, outcome: Outcome) -> None:
        self._keys[key] = (accepted_at, outcome)
        self._keys.move_to_end(key)
        self._expire(accepted_at)

    def _expire(self, now_s: float) -> None:
        cutoff = now_s - self.ttl_s
        while self._keys:
            key, (at, _) = next(iter(self._keys.items()))
            if at >= cutoff and len(self._keys) <= self.max_keys:
                break
            del self._keys[key]

    # ---- persistence in the window snapshot (plain arrays, no pickle) ----------------------
    def export(self) -> dict[str, np.ndarray]:
        items = list(self._keys.items())
        return {
            "idempotency_keys": np.array([k for k, _ in items], dtype=np.str_),
            "idempotency_at": np.array([v[0] for _, v in items], dtype=np.float64),
            "idempotency_acknowledged": np.array([v[1][0] for _, v in items], dtype=np.int64),
            "idempotency_stale": np.array([v[1][1] for _, v in items], dtype=np.int64),
        }

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        keys = arrays.get("idempotency_keys")
        if keys is None:
            return
        at, acknowledged = arrays["idempotency_at"], arrays["idempotency_acknowledged"]
        stale = arrays.get("idempotency_stale", np.zeros(len(keys), dtype=np.int64))
        rows = zip(keys.tolist(), at.tolist(), acknowledged.tolist(), stale.tolist(), strict=True)
        for key, when, count, old in rows:
            self.add(str(key), float(when), (int(count), int(old)))
