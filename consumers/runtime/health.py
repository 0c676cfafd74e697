"""One small HTTP endpoint per consumer process: ``/metrics``, ``/healthz`` and ``/readyz``.

* ``/healthz`` (liveness) answers 503 when the event loop stopped running or a partition's
  oldest in-flight record is older than ``stuck_after_s``: a stuck partition is not live, and a
  restart redelivers what held it.
* ``/readyz`` answers 200 between start-up and the beginning of shutdown.

It serves from a daemon thread and reads only snapshots the event loop publishes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from schemas.errors import ConfigurationError


@dataclass(frozen=True)
class Health:
    """What ``/healthz`` answers: 200 when ``live``, 503 otherwise, with ``reason``."""

    live: bool
    reason: str


class HealthServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        port: int,
        live: Callable[[], Health],
        ready: Callable[[], bool],
    ) -> None:
        self.registry = registry
        self.port = port
        self.live = live
        self.ready = ready
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        """Listen on ``port`` (0: do nothing)."""
        if not self.port:
            return
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    health = outer.live()
                    self._send(200 if health.live else 503, health.reason.encode() + b"\n")
                elif path == "/readyz":
                    ready = outer.ready()
                    self._send(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # one line per scrape would drown the consumer's own log

        try:
            self._server = ThreadingHTTPServer(("0.0.0.0", self.port), Handler)
        except OSError as error:
            raise ConfigurationError(
                f"cannot serve /metrics on port {self.port}: {error.strerror or error}"
            ) from error
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="health", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
