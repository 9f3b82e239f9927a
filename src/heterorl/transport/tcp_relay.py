"""A TCP relay on loopback that counts the bytes each way and can be switched off: how benchmarks/egress.py
measures what a learner really sends (HTTP bodies and headers included), and how the store tests cut a store off
(an outage: open connections are reset, new ones refused) and bring it back. A tool for measurements and tests;
nothing in a run uses it.
"""

from __future__ import annotations

import contextlib
import socket
import threading

CHUNK = 1 << 16


class TcpRelay:
    """Forwards 127.0.0.1:<port> to (host, port); `sent_upstream` counts client -> target bytes,
    `sent_downstream` target -> client bytes."""

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.target = target
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self.url_host = f"{host}:{self.port}"
        self.sent_upstream = 0
        self.sent_downstream = 0
        self.up = True
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
                with self._lock:
                    if upstream:
                        self.sent_upstream += len(data)
                    else:
                        self.sent_downstream += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._open -= {src, dst}

    def down(self) -> None:
        """An outage: reset every open connection and refuse new ones until `restore`."""
        self.up = False
        with self._lock:
            conns = list(self._open)
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self._closed = True
        self.down()
        self._listener.close()
