"""Live terminal view of the demo: a block redrawn in place with plain ANSI codes on a TTY,
one ``key=value`` line every few seconds otherwise (logs, CI, pipes). No curses.
"""

from __future__ import annotations

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
            lines = render_block(snap, self._rates.requests_per_s, self._rates.rows_per_s)
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
    speed = snap.sim_s / snap.wall_s if snap.wall_s > 0 else 0.0
    state = "done" if snap.done else "running"
    target = snap.quantile
    version = snap.model_version or "-"
    return [
        f"{_BOLD}latency-stack demo{_RESET} ({state})  simulated {snap.sim_s:6.1f} / {snap.duration_s:g} s"
        f"   wall {snap.wall_s:6.1f} s   {speed:5.1f}x real time",
        f"  traffic     {requests_per_s:7.1f} req/s  {rows_per_s:8.1f} rows/s   "
        f"prediction call p50 {_ms(snap.call_p50_ms)}  p99 {_ms(snap.call_p99_ms)}"
        f"   errors {snap.prediction_errors}",
        f"  model       {version}  ({snap.versions_seen} version(s) seen)   requests {snap.requests}",
        _accuracy_line("TTFT", snap.ttft, target),
        _accuracy_line("TPOT", snap.tpot, target),
        f"  samples     sent {snap.samples_sent}  accepted {snap.samples_accepted}  queued "
        f"{snap.samples_queued}  throttled {snap.samples_throttled}  rejected {snap.samples_rejected}",
    ]


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


def _accuracy_line(name: str, acc: AccuracySummary, target: float) -> str:
    if acc.coverage is None or acc.mape is None:
        return f"  {name} p{target * 100:g}    waiting for completions"
    gap = abs(acc.coverage - target)
    colour = _GREEN if gap <= 0.02 else _YELLOW if gap <= 0.05 else _RED
    return (
        f"  {name} p{target * 100:g}    coverage {colour}{acc.coverage * 100:5.1f}%{_RESET} (target "
        f"{target * 100:g}%)   MAPE {acc.mape * 100:5.1f}%   over the last {acc.count} completions"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
