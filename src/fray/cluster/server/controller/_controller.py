"""The controller as a running server: its store, API, operator API, queues and dashboard behind one port.

:class:`Controller` composes the parts -- :class:`~fray.cluster.server.store.ClusterStore`,
:class:`~fray.cluster.server.controller.ControllerService` (jobs, workers, scheduling),
:class:`~fray.cluster.server.ops.OpsService` (the operator API and dashboard),
:class:`~fray.cluster.server.controller._queues.QueueService` (durable queues) -- and serves them with one
data-only :class:`~fray.cluster.rpc.datarpc.DataServer` (TLS beyond loopback).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fray.cluster.protocol.messages import max_argument_bytes
from fray.cluster.rpc.datarpc import DataServer
from fray.cluster.rpc.namespace import default_token
from fray.cluster.rpc.tls import (
    TlsFiles,
    ca_pin,
    ensure_cluster_tls,
    forget_ca,
    is_loopback_address,
    record_ca,
    server_context,
)
from fray.cluster.server._retention import RetentionPolicy
from fray.cluster.server.controller._api import ControllerAPI
from fray.cluster.server.controller._ops_api import OpsAPI
from fray.cluster.server.controller._queues import QueueAPI, QueueService, with_queues
from fray.cluster.server.controller._service import ControllerService
from fray.cluster.server.ops import OpsService
from fray.cluster.server.store import ClusterStore
from fray.errors import ConfigError

__all__ = ["Controller"]


class Controller:
    """A running controller: the store at ``db_path`` served on ``host:port``.

    The token (default ``FRAY_TOKEN``) is required of every worker, client and
    resolver before any request is decoded, and requests are plain data
    (:mod:`fray.cluster.rpc.datarpc`): the controller never unpickles anything. Bound to an
    address other than loopback, the controller makes (once) a cluster CA and its own
    certificate in ``tls_dir`` (default: ``tls/`` beside the database) and requires TLS
    of every peer beyond this machine; clients need the CA (``FRAY_TLS_CA``), or a credential
    that pins it. With ``record_ca`` (what ``fray controller`` does), while it serves it records
    where its CA is (:func:`~fray.cluster.rpc.tls.record_ca`), so that its user's clients on this
    machine find it without ``FRAY_TLS_CA``.
    """

    def __init__(
        self,
        db_path: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | bytes | None = None,
        worker_timeout: float = 10.0,
        advertise_host: str | None = None,
        max_request_bytes: int | None = None,
        tls_dir: str | None = None,
        retention: RetentionPolicy | None = None,
        dashboard_port: int | None = None,
        dashboard_host: str = "127.0.0.1",
        record_ca: bool = False,
    ) -> None:
        resolved = default_token(token)
        if resolved is None:
            raise ConfigError("the controller needs a token (FRAY_TOKEN or token=): it never runs unauthenticated")
        self._master = resolved
        self._dashboard_at = None if dashboard_port is None else (dashboard_host, dashboard_port)
        self.dashboard: Any = None
        tls = None
        if not is_loopback_address(host):
            # Beyond this machine every connection is TLS, checked against this cluster's own CA.
            directory = tls_dir or os.path.join(os.path.dirname(os.path.abspath(db_path)), "tls")
            self.tls_files: TlsFiles | None = ensure_cluster_tls(directory, [h for h in (advertise_host, host) if h])
            tls = server_context(self.tls_files)
        else:
            self.tls_files = None
        self.store = ClusterStore(db_path)
        #: The pin of the cluster CA (``sha256:HEX``; "" without TLS): credentials the controller issues carry it.
        self.pin = ca_pin(self.tls_files.ca_cert.read_text()) if self.tls_files is not None else ""
        #: Where the CA was recorded for this user (``~/.config/fray/cas/HOST-PORT.pem``) once serving, or None.
        self.ca_record: Path | None = None
        self._record_ca = record_ca
        self.service = ControllerService(self.store, worker_timeout=worker_timeout, master=resolved, pin=self.pin)
        # The operator API (listings, status, retention, workspaces): its own object, served by the
        # same data-only server under "ops." method names (see fray.cluster.server.controller._ops_api).
        self.ops = OpsService(
            self.store,
            spec_command=lambda job_id: self.service.job_spec(job_id).command,
            controller=self.service,
            retention=retention,
        )
        # Durable queues with leases: their own state and tables, "queue.*" methods (fray.cluster.server.controller._queues).
        self.queues = QueueService(self.store)
        self.service.queues = self.queues
        api = ControllerAPI(self.service, ops=OpsAPI(self.ops))
        self.server = DataServer(
            with_queues(api, QueueAPI(self.queues, self.service.storage_failed), self.service),
            host,
            port,
            self.service.key_for,
            advertise_host=advertise_host,
            # A job's arguments, plus room for the rest of the request.
            max_request_bytes=max_request_bytes or max_argument_bytes() + (16 << 20),
            name="controller",
            tls=tls,
        )
        self.ops.address = self.server.address

    @property
    def address(self) -> str:
        """``host:port`` of the controller."""
        return self.server.address

    def start(self) -> Controller:
        """Serve in background threads (and the dashboard, when one was asked for)."""
        if self._dashboard_at is not None:
            self.dashboard = self.ops.serve_dashboard(self._master, *self._dashboard_at)
        self.service.start()
        self.ops.start()
        self.server.start()
        if self.tls_files is not None and self._record_ca:
            # So that its user's `fray` commands on this machine find the CA without FRAY_TLS_CA.
            self.ca_record = record_ca(self.address, self.tls_files.ca_cert)
        return self

    def stop(self) -> None:
        """Stop serving and close the store."""
        if self.dashboard is not None:
            self.dashboard.stop()
        self.service.stop()
        self.ops.stop()
        self.server.stop()
        self.store.close()
        if self.ca_record is not None and self.tls_files is not None:
            forget_ca(self.address, self.tls_files.ca_cert)
