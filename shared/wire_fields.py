"""The wire's fields: what a feature row and a training entry hold (wire-contract.md section 1).

Each field is a ``FieldSpec``: its kind (a float, an integer, or the ``pod_type`` name), inclusive
bounds and default (``None``: required). ``shared.schemas`` validates bodies against these specs,
``shared.row_decoder`` generates its typed structs from them, and validated rows become
``Columns``: one float64 column per field (``pod_type`` as its integer code).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

# Generous but finite: keeps every feature exactly representable after float32 conversion
# of the derived features and rejects garbage such as 1e300 tokens.
MAX_COUNT = 2**31 - 1
MAX_LATENCY_MS = 3_600_000.0  # one hour
POD_TYPE_CODES: dict[str, int] = {"": 0, "prefill": 1, "decode": 2}
POD_TYPE_NAMES = {code: name for name, code in POD_TYPE_CODES.items()}

Kind = Literal["float", "int", "pod_type"]


@dataclass(frozen=True)
class FieldSpec:
    """One wire field: its kind, inclusive bounds and default (``None`` = required)."""

    name: str
    kind: Kind
    lo: float = 0.0
    hi: float = MAX_COUNT
    default: float | None = None

    @property
    def required(self) -> bool:
        return self.default is None


ROW_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("kv_cache_percentage", "float", 0.0, 1.0),
    FieldSpec("input_token_length", "int"),
    FieldSpec("num_request_waiting", "int"),
    FieldSpec("num_request_running", "int"),
    FieldSpec("num_tokens_generated", "int"),
    FieldSpec("prefix_cache_score", "float", 0.0, 1.0),
    FieldSpec("pod_type", "pod_type", default=0),
    FieldSpec("prefill_tokens_in_flight", "int", default=0),
    FieldSpec("decode_tokens_in_flight", "int", default=0),
    FieldSpec("encoder_matched_size", "int", default=0),
    FieldSpec("encoder_input_size", "int", default=0),
)
ROW_FIELD_NAMES = tuple(f.name for f in ROW_FIELDS)

TARGET_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("actual_ttft_ms", "float", 0.0, MAX_LATENCY_MS),
    FieldSpec("actual_tpot_ms", "float", 0.0, MAX_LATENCY_MS),
)
# Optional: the prediction the scheduler acted on for this request (newer llm-d routers send
# it). 0 or absent means "not sent", the same convention as the ``actual_*`` targets.
PREDICTED_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("predicted_ttft_ms", "float", 0.0, MAX_LATENCY_MS, default=0.0),
    FieldSpec("predicted_tpot_ms", "float", 0.0, MAX_LATENCY_MS, default=0.0),
)

Columns = dict[str, np.ndarray]
"""Field name -> float64 column (``pod_type`` holds its integer code)."""


def pod_type_name(code: int) -> str:
    return POD_TYPE_NAMES.get(int(code), "")
