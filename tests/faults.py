"""The faults tests play: a TCP proxy in front of the test Postgres (a server that hangs, one
that is down, a connection that breaks around the ledger writer's COMMIT), and a ledger
writer held while it seals a receipt (a slow or stuck commit)."""

from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import Any

import pytest

from receipts import ledger_writer

# What the ledger's writer sets on each of its connections (receipts/store.py), and so
# what tells its sessions from the reader's.
WRITER_MARK = b"idle_in_transaction_session_timeout"


class PostgresProxy:
    """Forwards 127.0.0.1:``port`` to Postgres on ``target_port``.

    - ``frozen`` set: every connection stays open and moves no byte either way (a stopped
      server, a partition).
    - ``refusing`` set: new connections are closed at once (a server that is down).
    - ``cut_at_commit("after")``: the writer's next COMMIT reaches the server, which commits,
      and its reply is dropped with the connection; ``"before"``: the COMMIT (and the
      writes sent with it) is dropped with the connection, so nothing commits.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen = threading.Event()
        self.refusing = threading.Event()
        self.cut = threading.Event()  # set once an armed cut has happened
        self._cut_mode: str | None = None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, server_url: str) -> str:
        """``server_url`` (the real server's SQLAlchemy URL) pointed at this proxy."""
        host_port = server_url.split("@", 1)[1].split("/", 1)[0]
        return server_url.replace(host_port, f"127.0.0.1:{self.port}")

    def cut_at_commit(self, mode: str) -> None:
        if mode not in ("after", "before"):
            raise ValueError(f"mode is 'after' or 'before', not {mode!r}")
        self.cut.clear()
        self._cut_mode = mode

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing.is_set():
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        writer = False
        with client, upstream:
            while not self._closed:
                if self.frozen.is_set():
                    time.sleep(0.01)
                    continue
                for key, _ in selector.select(timeout=0.05):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if key.fileobj is client:
                        writer = writer or WRITER_MARK in data
                        if writer and self._cut_mode and b"COMMIT" in data:
                            self._cut(data, upstream)
                            return
                    key.data.sendall(data)

    def _cut(self, data: bytes, upstream: socket.socket) -> None:
        mode, self._cut_mode = self._cut_mode, None
        if mode == "after":
            upstream.sendall(data)
            time.sleep(0.5)  # the server commits; its reply goes nowhere
        self.cut.set()

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def hold_sealing(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold the ledger's writer inside its transaction, once it has claimed a draft and is
    about to seal it, until the second event is set (60 s at most); the first is set when it
    gets there."""
    sealing, release = threading.Event(), threading.Event()
    seal = ledger_writer.seal

    def seal_when_released(*args: Any, **kwargs: Any) -> Any:
        sealing.set()
        release.wait(60)
        return seal(*args, **kwargs)

    monkeypatch.setattr(ledger_writer, "seal", seal_when_released)
    return sealing, release
