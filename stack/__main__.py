"""``python -m stack`` (console script ``latency-stack``): the whole system on this machine.

Starts the training server, ``--replicas`` prediction servers sharing the model store under
``--data-dir`` and the coalescer in front of them, waits until each is ready and prints the
URLs to give a scheduler. With ``--demo`` it then drives the simulated demo workload through
the coalescer and stops when the demo ends; otherwise it runs until Ctrl-C or SIGTERM.
Exit status: 0 after a requested stop or a finished demo, 1 if a service failed.
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
from stack.launcher import ChildExited, Launcher, StackError

log = logging.getLogger("stack")

# Demo-only defaults (the environment still wins): retrain often enough that a short demo
# shows the model being replaced, instead of the production cadence of a minute.
_DEMO_ENV_DEFAULTS = {
    "TRAINING_SERVER_RETRAIN_INTERVAL_S": "10",
    "TRAINING_SERVER_MIN_NEW_SAMPLES": "2000",
    "TRAINING_SERVER_RETRAIN_MIN_GAP_S": "3",
}


class _StopRequested(BaseException):
    """Raised by the SIGTERM handler so shutdown runs the same path as Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_cli(StackSettings, argv, prog="latency-stack")
    configure_logging("stack", settings.log_level)
    env_defaults = _DEMO_ENV_DEFAULTS if settings.demo else {}
    launcher = Launcher(settings, env_defaults=env_defaults)
    signal.signal(signal.SIGTERM, _on_sigterm)
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
        launcher.stop()
    return code


def _print_urls(launcher: Launcher) -> None:
    replicas = [c.url for c in launcher.children if c.spec.module == "prediction_server"]
    print(
        "\nlatency stack ready. Point a scheduler at it with:\n"
        f"  TRAINING_SERVER_URL={launcher.training_url}\n"
        f"  PREDICTION_SERVER_URL={launcher.coalescer_url}\n"
        f"(the coalescer at {launcher.coalescer_url} also accepts /add_training_data_bulk; "
        f"prediction replicas: {', '.join(replicas)}; logs in {launcher.log_dir})\n",
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
        speed=settings.demo_speed,
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
