"""``python -m stack`` (console script ``latency-stack``): the whole system on this machine.

Starts the training server, ``--replicas`` prediction servers sharing the model store under
``--data-dir`` and the coalescer in front of them, waits until each is ready and prints the
URLs to give a scheduler. With ``--demo`` it then drives the simulated demo workload through
the coalescer (in its own data directory, ``var/demo``, with the launcher's log in a file so
the terminal shows the panel) and stops when the demo ends; otherwise it runs until Ctrl-C
(SIGINT) or SIGTERM, both handled explicitly, so a stack started as a background job with
SIGINT ignored still stops on it. Exit status: 0 after a requested stop or a finished demo,
1 if a service failed.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

import orjson

from shared.config import settings_from_cli
from shared.logging import configure_logging, log_event
from stack.config import StackSettings
from stack.launcher import ChildExited, Launcher, StackError, describe_exits

log = logging.getLogger("stack")

PROG = "python -m stack"
EPILOG = """\
The demo: a simulated pool of LLM-serving pods routed by the stack's predictions, with a live panel:
  python -m stack --demo            about a minute; --fast for about 10 s; data in var/demo
  python -m stack.demo --prediction-url URL --training-url URL
                                    the same demo against a stack that is already running
"""


class _StopRequested(BaseException):
    """Raised by the SIGINT/SIGTERM handler: shutdown runs one path whichever signal came."""


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_cli(StackSettings, argv, prog=PROG, epilog=EPILOG)
    log_file = settings.data_dir.resolve() / "logs" / "stack.log" if settings.demo else None
    configure_logging("stack", settings.log_level, path=log_file)
    launcher = Launcher(settings)
    # Explicit handlers for both: Python only turns SIGINT into KeyboardInterrupt when the signal
    # was not ignored at start, and a shell's background job (or nohup) starts us with it ignored.
    signal.signal(signal.SIGINT, _on_stop_signal)
    signal.signal(signal.SIGTERM, _on_stop_signal)
    _print_banner(settings, launcher)
    code = 0
    try:
        launcher.start()
        _print_urls(launcher)
        if settings.demo:
            _run_demo(settings, launcher)
        else:
            while True:
                launcher.check()
                time.sleep(0.5)
    except (KeyboardInterrupt, _StopRequested):
        print("\nlatency-stack: stopping (signal received)", flush=True)
        log_event(log, "stop_requested")
    except StackError as exc:
        log_event(log, "stack_failed", logging.ERROR, error=str(exc))
        print(f"\nlatency-stack: {exc}", file=sys.stderr, flush=True)
        if isinstance(exc, ChildExited) and exc.log_tail:
            print(f"last lines of {exc.log_path}:\n{exc.log_tail}", file=sys.stderr, flush=True)
        code = 1
    finally:
        # A second Ctrl-C must not interrupt the cleanup and leave services running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        codes = launcher.stop()
        if codes:
            print(describe_exits(codes), flush=True)
    return code


def _print_banner(settings: StackSettings, launcher: Launcher) -> None:
    what = "the demo on " if settings.demo else ""
    print(
        f"latency-stack: starting {what}a training server, {settings.replicas} prediction "
        f"replica(s)\n  and a coalescer on {settings.host} ports {settings.base_port}-"
        f"{settings.base_port + 1 + settings.replicas}\n  data in {settings.data_dir.resolve()}"
        f"\n  logs in {launcher.log_dir}",
        flush=True,
    )


def _print_urls(launcher: Launcher) -> None:
    replicas = [c.url for c in launcher.children if c.spec.module == "prediction_server"]
    print(
        "\nlatency stack ready. Point a scheduler at it with:\n"
        f"  TRAINING_SERVER_URL={launcher.training_url}\n"
        f"  PREDICTION_SERVER_URL={launcher.coalescer_url}\n"
        f"(the coalescer also accepts /add_training_data_bulk)\n"
        f"  prediction replicas: {', '.join(replicas)}\n"
        f"  logs in {launcher.log_dir}\n",
        flush=True,
    )


def _run_demo(settings: StackSettings, launcher: Launcher) -> None:
    from stack.demo import DemoConfig, run_demo  # the simulator is only needed with --demo

    cfg = DemoConfig(
        prediction_url=launcher.coalescer_url,
        training_url=launcher.coalescer_url,
        training_server_url=launcher.training_url,
        duration_s=settings.demo_duration_s,
        pods=settings.demo_pods,
        rate_rps=settings.demo_rate_rps,
        speed=settings.demo_speed,  # --fast sets it to 0
        seed=settings.demo_seed,
        epsilon=settings.demo_epsilon,
        window=settings.demo_window,
    )
    summary = run_demo(cfg, watchdog=launcher.check)
    path = settings.data_dir.resolve() / "demo-summary.json"
    path.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    print(f"(summary saved to {path})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
