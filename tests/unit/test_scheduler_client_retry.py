"""A connection that breaks before any answer is resent once, within the same deadline.

The server is a raw socket on a loopback port: it hangs up on the first request without
answering (what a keep-alive connection closed by the server looks like to the client) and
answers the next ones properly.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import orjson
import pytest

from scheduler_client import ClientConfig, LatencyClient, Mode

ROW = {
    "kv_cache_percentage": 0.1,
    "input_token_length": 100,
    "num_request_waiting": 0,
    "num_request_running": 0,
    "num_tokens_generated": 1,
    "prefix_cache_score": 0.0,
}


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return body


def _serve(listener: socket.socket, hangups: list[int], stop: threading.Event) -> None:
    accepted = 0
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        conn.settimeout(None)
        accepted += 1
        with conn:
            body = _read_request(conn)
            if accepted <= hangups[0]:
                continue  # hang up without an answer
            rows = orjson.loads(body)["requests"]
            payload = orjson.dumps({"predictions": [{"ttft_ms": 5.0, "tpot_ms": 1.0} for _ in rows]})
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + f"content-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )


@pytest.fixture
def hangup_server() -> Iterator[tuple[str, list[int]]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.05)  # accept() wakes up to notice the stop flag
    hangups, stop = [1], threading.Event()
    thread = threading.Thread(target=_serve, args=(listener, hangups, stop), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", hangups
    stop.set()
    thread.join(5)
    listener.close()


async def test_a_broken_connection_is_resent_once(hangup_server: tuple[str, list[int]]) -> None:
    url, _ = hangup_server
    async with LatencyClient(url, config=ClientConfig(predict_timeout_s=2.0)) as client:
        predictions = await client.predict([ROW, ROW])
        assert predictions is not None and len(predictions) == 2
        assert client.counters.predict_retries == 1 and client.mode is Mode.PREDICTED


async def test_a_second_break_is_a_failure(hangup_server: tuple[str, list[int]]) -> None:
    url, hangups = hangup_server
    hangups[0] = 2
    async with LatencyClient(url, config=ClientConfig(predict_timeout_s=2.0)) as client:
        assert await client.predict([ROW]) is None
        assert client.counters.predict_retries == 1 and client.counters.predict_errors == 1
        assert client.mode is Mode.FALLBACK
