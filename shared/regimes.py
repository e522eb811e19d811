"""Load regimes: the bins over queue depth and KV-cache use that latency depends on most.

Two consumers share these bins, so they live here, in one place:

- the training window's strata (``training_server.window``) use the fine edges
  ``WAITING_EDGES`` x ``KV_EDGES`` (plus prefix score and pod type);
- online calibration uses the same queue edges and a coarser KV split (``DEFAULT_SCHEME``: 7
  queue bins x 2 KV bins = 14 regimes): latency grows with the queue bin by bin, so each bin
  is calibrated on its own, while KV use matters mostly near the top (preemption); few enough
  regimes that busy ones see samples within seconds and per-regime Prometheus series stay few.

A scheme is recorded with the offsets in the model manifest (``RegimeOffsets``), so the
training server and every replica map a feature row to the same regime even if the default
scheme changes later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shared.features import FEATURE_NAMES

# A value v falls in bin searchsorted(edges, v, side="right").
WAITING_EDGES = np.array([1, 2, 4, 8, 16, 32], dtype=np.float64)
KV_EDGES = np.array([0.25, 0.5, 0.75, 0.9])

_WAITING = FEATURE_NAMES.index("num_request_waiting")
_KV = FEATURE_NAMES.index("kv_cache_percentage")


@dataclass(frozen=True)
class RegimeScheme:
    """Bin edges over ``num_request_waiting`` and ``kv_cache_percentage``."""

    waiting_edges: tuple[float, ...]
    kv_edges: tuple[float, ...]

    @property
    def size(self) -> int:
        return (len(self.waiting_edges) + 1) * (len(self.kv_edges) + 1)

    def ids(self, features: np.ndarray) -> np.ndarray:
        """The regime (int64 in ``[0, size)``) of each row of a ``shared.features`` matrix."""
        waiting = np.searchsorted(np.asarray(self.waiting_edges), features[:, _WAITING], side="right")
        kv = np.searchsorted(np.asarray(self.kv_edges), features[:, _KV], side="right")
        return (waiting * (len(self.kv_edges) + 1) + kv).astype(np.int64)

    def label(self, regime: int) -> str:
        """A short readable name such as ``waiting=4-7 kv=0-0.9``."""
        waiting, kv = divmod(int(regime), len(self.kv_edges) + 1)
        return f"waiting={_range(self.waiting_edges, waiting, True)} kv={_range(self.kv_edges, kv, False)}"

    def labels(self) -> list[str]:
        return [self.label(r) for r in range(self.size)]


def _range(edges: tuple[float, ...], index: int, integer: bool) -> str:
    lo = 0.0 if index == 0 else float(edges[index - 1])
    if integer:
        return f"{int(lo)}+" if index == len(edges) else f"{int(lo)}-{int(edges[index]) - 1}"
    return f"{lo:g}-1" if index == len(edges) else f"{lo:g}-{float(edges[index]):g}"


DEFAULT_SCHEME = RegimeScheme(waiting_edges=tuple(float(v) for v in WAITING_EDGES), kv_edges=(0.9,))


@dataclass(frozen=True)
class RegimeOffsets:
    """Per-regime margin offsets of one model, with the scheme they were computed for.

    ``offsets[r]`` is added to the margin (after ``ModelSpec.calibration_offset``) of rows in
    regime ``r``; it corrects the calibration of that regime between retrains.
    """

    waiting_edges: tuple[float, ...]
    kv_edges: tuple[float, ...]
    offsets: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "waiting_edges", tuple(float(v) for v in self.waiting_edges))
        object.__setattr__(self, "kv_edges", tuple(float(v) for v in self.kv_edges))
        object.__setattr__(self, "offsets", tuple(float(v) for v in self.offsets))
        if len(self.offsets) != self.scheme.size:
            raise ValueError(f"{len(self.offsets)} regime offsets for a scheme of {self.scheme.size} regimes")

    @property
    def scheme(self) -> RegimeScheme:
        return RegimeScheme(self.waiting_edges, self.kv_edges)

    @classmethod
    def of(cls, scheme: RegimeScheme, offsets: Any) -> RegimeOffsets:
        return cls(scheme.waiting_edges, scheme.kv_edges, tuple(offsets))

    def for_rows(self, features: np.ndarray) -> np.ndarray:
        """The offset of each row (float64)."""
        return np.asarray(self.offsets, dtype=np.float64)[self.scheme.ids(features)]
