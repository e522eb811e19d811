"""Acknowledged means durable: ``kill -9`` of a real training server loses no sample it answered
202 for, duplicates none, survives a torn journal tail, and honours ``Idempotency-Key`` resends.

Every sample carries a unique id in ``encoder_input_size`` (a field that does not pick the
stratum), so after the restart the window's ids are compared with what was acknowledged. The
window is read from the snapshot the restarted server writes on its graceful stop.
"""

from __future__ import annotations

import random
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.load import LoadThreads
from tests.procs import RunningService, start_service, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

# No retrain, no periodic save (so only the journal can bring the samples back), no cap eviction.
FLAGS = ["--min-new-samples", "100000000", "--retrain-interval-s", "100000", "--persist-interval-s", "3600",
         "--stratum-cap", "1000000", "--max-pending-samples", "200000"]  # fmt: skip


def _start(data_dir: Path, logs: Path, *extra: str) -> RunningService:
    return start_service("training_server", ["--data-dir", str(data_dir), *FLAGS, *extra], log_dir=logs)


def _body(first_id: int, n: int) -> bytes:
    entries = synthetic.to_entries(synthetic.samples(n, np.random.default_rng(first_id)))
    for i, entry in enumerate(entries):
        entry["encoder_input_size"] = first_id + i
    return orjson.dumps({"entries": entries})


def _status(service: RunningService) -> dict[str, Any]:
    status: dict[str, Any] = httpx.get(service.url + "/status", timeout=10).json()
    return status


def _window_ids(service: RunningService, data_dir: Path) -> np.ndarray:
    """Stop gracefully (which saves the window) and return the ids of the samples in it."""
    assert service.stop() in (0, -signal.SIGTERM), service.logs()[-3000:]
    with np.load(data_dir / "window.npz", allow_pickle=False) as saved:
        names = [str(name) for name in saved["columns"]]
        return saved["data"][:, names.index("encoder_input_size")].astype(np.int64)


def test_sigkill_right_after_202s_loses_nothing(tmp_path: Path) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    first = _start(data_dir, logs)
    with httpx.Client(timeout=10) as client:
        for batch in range(20):
            response = client.post(
                first.url + "/add_training_data_bulk", content=_body(batch * 1000 + 1, 1000)
            )
            assert response.status_code == 202, response.text
            assert response.json() == {"message": "Accepted 1000 training samples."}
    first.kill()  # at once: no shutdown hook, no save

    second = _start(data_dir, logs)
    status = _status(second)
    assert status["window"]["samples"] == 20_000
    assert status["journal"]["replayed_samples"] == 20_000
    ids = _window_ids(second, data_dir)
    assert sorted(ids.tolist()) == list(range(1, 20_001))
    # The graceful stop saved the window and compacted the journal it covers.
    assert not list((data_dir / "journal").glob("journal-*.log"))


class _Feeder(LoadThreads):
    """Threads posting 500-sample batches with unique ids; records which ones got a 202."""

    def __init__(self, url: str, threads: int = 4) -> None:
        super().__init__(threads)
        self.url = url
        self.acked: list[range] = []
        self.sent: list[range] = []
        self._next = 1

    def step(self, client: httpx.Client, worker: int) -> bool:
        with self.lock:
            ids = range(self._next, self._next + 500)
            self._next += 500
            self.sent.append(ids)
        try:
            response = client.post(self.url + "/add_training_data_bulk", content=_body(ids.start, 500))
        except httpx.HTTPError:
            return False  # the server died under us: this batch was never acknowledged
        if response.status_code == 202:
            with self.lock:
                self.acked.append(ids)
        return True

    def acked_count(self) -> int:
        with self.lock:
            return sum(len(r) for r in self.acked)


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_sigkill_at_a_random_moment_during_ingestion_loses_and_duplicates_nothing(
    tmp_path: Path, fsync: str
) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    rng = random.Random()
    server = _start(data_dir, logs, "--journal-fsync", fsync)
    with _Feeder(server.url) as feeder:
        wait_until(lambda: feeder.acked_count() >= 5000, "the first acknowledged batches")
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment mid-ingestion
        server.kill()
    acked = {i for r in feeder.acked for i in r}
    sent = {i for r in feeder.sent for i in r}
    assert len(acked) >= 5000

    restarted = _start(data_dir, logs, "--journal-fsync", fsync)
    ids = _window_ids(restarted, data_dir)
    window = set(ids.tolist())
    assert len(window) == len(ids), "a sample was inserted twice"
    assert acked <= window, f"{len(acked - window)} acknowledged samples lost"
    assert window <= sent
    # Whole batches only: a batch is in or out, never half of it.
    assert all(set(r) <= window or not set(r) & window for r in feeder.sent)


def test_a_torn_journal_tail_is_quarantined_not_fatal(tmp_path: Path) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    first = _start(data_dir, logs)
    for batch in range(3):
        response = httpx.post(first.url + "/add_training_data_bulk", content=_body(batch * 1000 + 1, 1000))
        assert response.status_code == 202
    first.kill()
    (segment,) = sorted((data_dir / "journal").glob("journal-*.log"))
    size = segment.stat().st_size
    with open(segment, "r+b") as f:  # a crash mid-write: the last record is cut short
        f.truncate(size - 5000)

    second = _start(data_dir, logs)
    status = _status(second)
    assert status["window"]["samples"] == 2000  # the two intact batches
    assert 'training_quarantined_files_total{kind="journal"} 1.0' in httpx.get(second.url + "/metrics").text
    assert "journal_corrupt_tail_quarantined" in second.logs()
    (moved,) = (data_dir / "journal").glob("journal-*.log.corrupt-*")
    assert moved.stat().st_size > 0
    # It keeps ingesting and a later crash replays old and new records alike.
    assert httpx.post(second.url + "/add_training_data_bulk", content=_body(10_001, 1000)).status_code == 202
    second.kill()
    third = _start(data_dir, logs)
    ids = _window_ids(third, data_dir)
    assert sorted(ids.tolist()) == [*range(1, 2001), *range(10_001, 11_001)]


def test_a_resent_idempotency_key_is_not_inserted_twice_even_across_sigkill(tmp_path: Path) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    url = "/add_training_data_bulk"
    first = _start(data_dir, logs)
    body = _body(1, 1000)
    for _ in range(3):
        response = httpx.post(first.url + url, content=body, headers={"Idempotency-Key": "relay-batch-1"})
        assert response.status_code == 202 and response.json() == {
            "message": "Accepted 1000 training samples."
        }
    other = httpx.post(
        first.url + url, content=_body(5001, 500), headers={"Idempotency-Key": "relay-batch-2"}
    )
    assert other.status_code == 202
    wait_until(lambda: _status(first)["window"]["samples"] == 1500, "both batches once")
    assert "training_ingest_duplicate_batches_total 2.0" in httpx.get(first.url + "/metrics").text
    first.kill()

    second = _start(data_dir, logs)
    response = httpx.post(second.url + url, content=body, headers={"Idempotency-Key": "relay-batch-1"})
    assert response.status_code == 202 and response.json() == {"message": "Accepted 1000 training samples."}
    assert _status(second)["window"]["samples"] == 1500
    # After a snapshot (journal compacted) the key is still known: it is in the snapshot.
    assert second.stop() in (0, -signal.SIGTERM)
    third = _start(data_dir, logs)
    assert (
        httpx.post(third.url + url, content=body, headers={"Idempotency-Key": "relay-batch-1"}).status_code
        == 202
    )
    assert sorted(_window_ids(third, data_dir).tolist()) == [*range(1, 1001), *range(5001, 5501)]


def test_a_resend_that_arrives_while_the_first_attempt_is_still_uploading_is_inserted_once(
    tmp_path: Path,
) -> None:
    """The relay's resend after a timeout can reach the server while the first attempt's body is
    still arriving (a stalled server resumed with both in its socket). The first attempt claims its
    key before it reads the body, so the resend waits for it and both get the same 202."""
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    service = _start(data_dir, logs)
    body = _body(1, 1000)
    head = (
        f"POST /add_training_data_bulk HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Idempotency-Key: relay-batch-7\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()

    def in_order() -> None:
        # The server handles events in order: once a later request is answered, the bytes sent
        # before it were read and their handlers run up to their next wait.
        assert httpx.get(service.url + "/healthz").status_code == 200

    first = socket.create_connection(("127.0.0.1", service.port), timeout=30)
    resend = socket.create_connection(("127.0.0.1", service.port), timeout=30)
    try:
        first.sendall(head + body[: len(body) // 2])  # the first attempt, still uploading
        in_order()
        resend.sendall(head + body)  # the resend, complete
        in_order()
        first.sendall(body[len(body) // 2 :])
        answers = [_read_all(first), _read_all(resend)]
    finally:
        first.close()
        resend.close()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 202") and b"Accepted 1000 training samples." in answer, answer
    assert "training_ingest_duplicate_batches_total 1.0" in httpx.get(service.url + "/metrics").text
    assert sorted(_window_ids(service, data_dir).tolist()) == list(range(1, 1001))


def _read_all(conn: socket.socket) -> bytes:
    answer = b""
    while chunk := conn.recv(65536):
        answer += chunk
    return answer


def test_a_flush_is_not_undone_by_a_replay(tmp_path: Path) -> None:
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    first = _start(data_dir, logs)
    assert httpx.post(first.url + "/add_training_data_bulk", content=_body(1, 1000)).status_code == 202
    wait_until(lambda: _status(first)["window"]["samples"] == 1000, "the batch in the window")
    assert httpx.post(first.url + "/flush").json()["flushed_samples"] == 1000
    assert httpx.post(first.url + "/add_training_data_bulk", content=_body(2001, 300)).status_code == 202
    first.kill()
    second = _start(data_dir, logs)
    assert sorted(_window_ids(second, data_dir).tolist()) == list(range(2001, 2301))
