"""The final pick: from per-pod costs (lower is better) to one pod index.

Every policy reduces the candidates to a list of costs, with ``math.inf`` for pods it rules
out, and hands them to a ``Picker``:

- ``temperature == 0`` and no ``top_k``: the lowest cost; ties are broken uniformly at random.
- ``top_k = k``: only the ``k`` lowest costs stay in the draw (ties at the cut stay in).
- ``temperature = T > 0``: a softmax draw, weight ``exp(-(cost - min_cost) / T)``; ``T`` is in
  the policy's cost unit (milliseconds for latency costs, a share of the SLO for headroom).
- ``top_k`` without a temperature: uniform among the ``k`` best.

Randomising the final pick keeps a crowd of schedulers with the same view from piling onto
the same pod. Every draw comes from the picker's own ``random.Random(seed)``, so a run is
reproducible.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


class Picker:
    """Chooses one index from costs; see the module docstring for the parameters."""

    def __init__(self, *, temperature: float = 0.0, top_k: int | None = None, seed: int = 0) -> None:
        if temperature < 0 or not math.isfinite(temperature):
            raise ValueError("temperature must be a finite number >= 0")
        if top_k is not None and top_k < 1:
            raise ValueError("top_k must be >= 1 (or None)")
        self.temperature = temperature
        self.top_k = top_k
        self.rng = random.Random(seed)

    def pick(self, costs: Sequence[float]) -> int:
        """Index of the chosen candidate; ``ValueError`` if every cost is infinite or NaN."""
        finite = [(cost, i) for i, cost in enumerate(costs) if math.isfinite(cost)]
        if not finite:
            raise ValueError("no candidate with a finite cost")
        if self.top_k is not None and self.top_k < len(finite):
            cut = sorted(cost for cost, _ in finite)[self.top_k - 1]
            finite = [(cost, i) for cost, i in finite if cost <= cut]
        best = min(cost for cost, _ in finite)
        if self.temperature == 0.0:
            if self.top_k is not None:
                return self.rng.choice(finite)[1]
            return self.rng.choice([i for cost, i in finite if cost == best])
        weights = [math.exp(-(cost - best) / self.temperature) for cost, _ in finite]
        return self.rng.choices([i for _, i in finite], weights=weights)[0]
