"""A TCP relay on loopback that counts the bytes each way and can be switched off: how benchmarks/egress.py
measures what a learner really sends (HTTP bodies and headers included), and how tests cut a link -- an outage
(`down`: open connections are reset, new ones refused) or a black hole (`blackhole`: connections stay open and
new ones are accepted, but no byte gets through, as when a route is lost and TCP retransmits into the void) --
and bring it back (`restore`). A tool for measurements and tests; nothing in a run uses it.
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
        self.passing = threading.Event()  # cleared while the link is a black hole
        self.passing.set()
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
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        """Join an accepted client to the target (once the link passes bytes again, during a black hole)."""
        while not self.passing.wait(0.1):
            if self._closed:
                client.close()
                return
        try:
            server = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
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
                while not self.passing.wait(0.1):  # a black hole: hold the bytes (TCP would retransmit them)
                    if self._closed:
                        return
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

    def blackhole(self) -> None:
        """A link that answers nothing: connections stay open, no byte passes either way until `restore`."""
        self.passing.clear()

    def restore(self) -> None:
        self.up = True
        self.passing.set()

    def close(self) -> None:
        self._closed = True
        self.down()
        self._listener.close()
