"""The before/after table of accuracy runs reads the HTTP and the in-process dumps alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench.accuracy_compare import as_replays, main, table, totals


def _model(pinball_ms: float, passed: list[bool]) -> dict[str, Any]:
    overall = {"samples": 100, "coverage": 0.9, "pinball_ms": pinball_ms, "ratio": 0.5}
    summary = {"overall": overall, "regime": {}, "steps": []}
    return {"summary": summary, "checks": [{"target": "t", "pass": p} for p in passed]}


def _in_process(ttft_ms: tuple[float, float], tpot_ms: tuple[float, float]) -> dict[str, Any]:
    """A ``sim_calibration_replay.py --json`` dump of two replays."""
    return {
        f"overload seed {seed}": {
            "retrains": {},
            "ttft": _model(ttft_ms[seed], [True, seed == 0]),
            "tpot": _model(tpot_ms[seed], [False, False]),
        }
        for seed in (0, 1)
    }


def test_an_in_process_dump_takes_the_shape_of_an_http_dump() -> None:
    dump = _in_process((10.0, 20.0), (1.0, 2.0))
    normalised = as_replays(dump)
    assert [r["name"] for r in normalised] == ["overload seed 0", "overload seed 1"]
    assert normalised[1]["summaries"]["ttft"]["overall"]["pinball_ms"] == 20.0
    assert normalised[0]["checks"]["ttft"] == dump["overload seed 0"]["ttft"]["checks"]
    http = [{"name": "x", "summaries": {}, "checks": {}}]
    assert as_replays(http) is http  # an accuracy_evidence.py dump is already a list of replays


def test_the_totals_count_targets_met_and_where_the_pinball_is_lower_than_the_first_run() -> None:
    runs = {
        "main": as_replays(_in_process((10.0, 20.0), (1.0, 2.0))),
        "variant": as_replays(_in_process((9.0, 25.0), (0.5, 1.5))),
    }
    assert totals(runs) == [
        "- main: targets met TTFT 3 of 4; TPOT 0 of 4",
        "- variant: targets met TTFT 3 of 4, pinball lower than main's on 1 of 2; "
        "TPOT 0 of 4, pinball lower than main's on 2 of 2",
    ]
    rows = table(runs)
    assert rows[2] == "| overload seed 0 | TTFT | main | 0.900 | - | 10 ms | 0.50 | - | 2/2 |"
    assert len(rows) == 2 + 2 * 2 * 2  # header, rule, then replay x model x run


def test_the_command_writes_the_block_from_both_kinds_of_dump(tmp_path: Path) -> None:
    before, after, out = tmp_path / "main.json", tmp_path / "variant.json", tmp_path / "doc.md"
    before.write_bytes(orjson.dumps(_in_process((10.0, 20.0), (1.0, 2.0))))
    after.write_bytes(orjson.dumps(as_replays(_in_process((9.0, 25.0), (0.5, 1.5)))))  # the HTTP shape
    out.write_text("# doc\n")
    assert main([f"main={before}", f"variant={after}", "--out", str(out), "--block", "t"]) == 0
    text = out.read_text()
    assert "<!-- accuracy-evidence-t:begin -->" in text
    assert "- variant: targets met TTFT 3 of 4, pinball lower than main's on 1 of 2" in text
