"""Live terminal view of the demo: a block redrawn in place with plain ANSI codes on a TTY,
one ``key=value`` line every few seconds otherwise (logs, CI, pipes). No curses.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import TextIO

from stack.demo_stats import AccuracySummary

_CLEAR_LINE = "\x1b[2K"
_BOLD, _RESET = "\x1b[1m", "\x1b[0m"
_GREEN, _YELLOW, _RED = "\x1b[32m", "\x1b[33m", "\x1b[31m"


@dataclass(frozen=True)
class DemoSnapshot:
    """What the demo has done so far; counters are cumulative."""

    wall_s: float
    sim_s: float
    duration_s: float
    requests: int
    rows: int
    prediction_errors: int
    call_p50_ms: float | None
    call_p99_ms: float | None
    model_version: str | None
    versions_seen: int
    quantile: float
    ttft: AccuracySummary
    tpot: AccuracySummary
    samples_sent: int
    samples_accepted: int
    samples_queued: int
    samples_throttled: int
    samples_rejected: int
    done: bool = False


@dataclass
class _Rates:
    wall_s: float = 0.0
    requests: int = 0
    rows: int = 0
    requests_per_s: float = 0.0
    rows_per_s: float = 0.0

    def update(self, snap: DemoSnapshot) -> None:
        dt = snap.wall_s - self.wall_s
        if dt > 0:
            self.requests_per_s = (snap.requests - self.requests) / dt
            self.rows_per_s = (snap.rows - self.rows) / dt
        self.wall_s, self.requests, self.rows = snap.wall_s, snap.requests, snap.rows


@dataclass
class LiveView:
    """Show snapshots on ``out``; ``tty=None`` asks ``out.isatty()``."""

    out: TextIO
    tty: bool | None = None
    log_every_s: float = 5.0
    width: int | None = None  # None: the terminal's width, asked at every redraw (it may change)
    _rates: _Rates = field(default_factory=_Rates)
    _drawn_lines: int = 0
    _last_log_wall_s: float | None = None

    def __post_init__(self) -> None:
        if self.tty is None:
            isatty = getattr(self.out, "isatty", None)
            self.tty = bool(isatty and isatty())

    def update(self, snap: DemoSnapshot) -> None:
        self._rates.update(snap)
        if self.tty:
            width = self.width or _terminal_width(self.out)
            # One column spare: a line exactly as wide as the terminal makes some terminals wrap.
            lines = [
                fit(line, width - 1)
                for line in render_block(snap, self._rates.requests_per_s, self._rates.rows_per_s)
            ]
            parts = [f"\x1b[{self._drawn_lines}F"] if self._drawn_lines else []
            parts += [f"{_CLEAR_LINE}{line}\n" for line in lines]
            self.out.write("".join(parts))
            self._drawn_lines = len(lines)
        elif (
            snap.done
            or self._last_log_wall_s is None
            or snap.wall_s - self._last_log_wall_s >= self.log_every_s
        ):
            self.out.write(render_line(snap, self._rates.requests_per_s, self._rates.rows_per_s) + "\n")
            self._last_log_wall_s = snap.wall_s
        self.out.flush()


def render_block(snap: DemoSnapshot, requests_per_s: float, rows_per_s: float) -> list[str]:
    """The panel's lines, each under 80 visible characters (``fit`` cuts them to narrower terminals)."""
    speed = snap.sim_s / snap.wall_s if snap.wall_s > 0 else 0.0
    state = "done" if snap.done else "running"
    target = snap.quantile
    version = snap.model_version or "-"
    return [
        f"{_BOLD}latency-stack demo{_RESET} ({state}) simulated {snap.sim_s:.1f}/{snap.duration_s:g} s, "
        f"wall {snap.wall_s:.1f} s, {speed:.1f}x real time",
        f"  traffic   {requests_per_s:6.1f} req/s  {rows_per_s:7.1f} rows/s  prediction call p50 "
        f"{_ms(snap.call_p50_ms)}",
        f"  model     {version}  ({snap.versions_seen} seen)  p99 call {_ms(snap.call_p99_ms)}  "
        f"failed calls {snap.prediction_errors}",
        *_accuracy_lines("TTFT", snap.ttft, target),
        *_accuracy_lines("TPOT", snap.tpot, target),
        f"  samples   sent {snap.samples_sent}  accepted {snap.samples_accepted}  "
        f"queued {snap.samples_queued}  throttled {snap.samples_throttled}  rejected {snap.samples_rejected}",
    ]


def fit(line: str, width: int) -> str:
    """``line`` cut to ``width`` visible characters (ANSI colour codes kept, not counted), so no
    line of the panel ever wraps and the in-place redraw moves up exactly as many rows as it drew."""
    out: list[str] = []
    visible = 0
    i = 0
    cut = False
    while i < len(line):
        if line[i] == "\x1b":
            end = line.find("m", i)
            end = len(line) - 1 if end < 0 else end
            out.append(line[i : end + 1])
            i = end + 1
            continue
        if visible == width:
            cut = True
            break
        out.append(line[i])
        visible += 1
        i += 1
    text = "".join(out)
    return text + _RESET if cut and "\x1b" in text else text


def render_line(snap: DemoSnapshot, requests_per_s: float, rows_per_s: float) -> str:
    fields = {
        "sim_s": f"{snap.sim_s:.1f}/{snap.duration_s:g}",
        "wall_s": f"{snap.wall_s:.1f}",
        "req_per_s": f"{requests_per_s:.1f}",
        "rows_per_s": f"{rows_per_s:.1f}",
        "call_p50_ms": _num(snap.call_p50_ms, 2),
        "call_p99_ms": _num(snap.call_p99_ms, 2),
        "errors": str(snap.prediction_errors),
        "model": snap.model_version or "-",
        "ttft_cov": _num(snap.ttft.coverage, 3),
        "ttft_mape": _num(snap.ttft.mape, 3),
        "tpot_cov": _num(snap.tpot.coverage, 3),
        "tpot_mape": _num(snap.tpot.mape, 3),
        "samples_accepted": f"{snap.samples_accepted}/{snap.samples_sent}",
    }
    return "demo " + " ".join(f"{k}={v}" for k, v in fields.items())


def verdict(coverage: float, target: float) -> tuple[str, str]:
    """What a coverage means for a p``target`` model, in words, and its colour."""
    gap = coverage - target
    if abs(gap) <= 0.02:
        return "on target", _GREEN
    colour = _YELLOW if abs(gap) <= 0.05 else _RED
    if gap > 0:
        return "runs high: cautious", colour
    return "runs low: optimistic", colour


def _accuracy_lines(name: str, acc: AccuracySummary, target: float) -> list[str]:
    head = f"  {name} p{target * 100:g}  "
    if acc.coverage is None or acc.mape is None:
        return [f"{head}waiting for completions"]
    words, colour = verdict(acc.coverage, target)
    return [
        f"{head}{colour}{acc.coverage * 100:5.1f}%{_RESET} within prediction (target {target * 100:g}%)  "
        f"{colour}{words}{_RESET}",
        f"            off by {acc.mape * 100:.0f}% on average (MAPE), last {acc.count} completions",
    ]


def _terminal_width(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return shutil.get_terminal_size().columns


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
