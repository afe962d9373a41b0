"""The web dashboard: served by the controller process on its own port (127.0.0.1 by default).

Needs the ``dashboard`` extra (Starlette and uvicorn: ``pip install "fray[dashboard]"``).
Pages are rendered on the server (:mod:`fray.cluster.server.dashboard.pages`) and kept live with
server-sent events; :mod:`fray.cluster.server.dashboard.app` holds the routes and all of the
security (log-in, sessions, CSRF).
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from fray.cluster.server.dashboard.app import Backend, Sessions, build_app
from fray.errors import FrayError

__all__ = ["Dashboard"]


class Dashboard:
    """The dashboard of one controller: ``backend`` supplies the data, ``token`` guards the log-in.

    The port is bound at construction (so a busy port raises ``OSError`` at once and
    :attr:`address` is known); :meth:`start` serves in a background thread.
    """

    def __init__(self, backend: Backend, token: bytes, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sessions = Sessions(token)
        self._stopping = threading.Event()
        self.app = build_app(backend, self.sessions, stopping=self._stopping)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host = host
        self.port = int(self._sock.getsockname()[1])
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``host:port`` the dashboard serves on."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The dashboard's base URL."""
        return f"http://{self.address}/"

    def login_link(self) -> str:
        """A URL that logs a browser in once, within five minutes (what ``fray dashboard`` prints)."""
        return f"http://{self.address}/login?code={self.sessions.new_code()}"

    def start(self, timeout: float = 10.0) -> Dashboard:
        """Serve in a background thread; return once it accepts connections."""
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="fray-dashboard", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise FrayError(f"the dashboard did not start on {self.address}")
            time.sleep(0.01)  # uvicorn offers no event to wait on
        return self

    def stop(self) -> None:
        """Stop serving (open live streams end within a second)."""
        self._stopping.set()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sock.close()
