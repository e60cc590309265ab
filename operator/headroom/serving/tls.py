"""Server TLS contexts from PEM in memory, and certificates that change under a listener.

Python's ``ssl`` can only load a key from a file: a pair held in memory (the
webhook's, from its Secret; the metrics endpoint's self-signed one) is written to
a private temporary directory (an in-memory emptyDir in the chart, where the root
filesystem is read-only), loaded, and removed at once. The key is never logged.

A listener whose certificate may change (renewal, a rotated Secret) chooses, in its
SNI callback (OpenSSL calls it for every ClientHello, with or without a server
name), the context built from the newest pair: new handshakes get it without a
restart or a dropped listener.

A listener that requires clients' certificates (the scheduler extender's) sets
``CERT_REQUIRED`` on the listening context, because OpenSSL keeps the verify mode a
connection began with when the callback switches its context; the CAs it checks the
client with are the chosen context's.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from pathlib import Path
from typing import Any


def server_context() -> ssl.SSLContext:
    """TLS 1.2 or later, as a server."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def context_from_pem(
    directory: str, cert_pem: bytes, key_pem: bytes, *, client_cas: bytes | None = None
) -> ssl.SSLContext:
    """A server context for the pair; the files exist only while it is loaded.
    ``client_cas``: only clients with a certificate those CAs issued for ``clientAuth``
    complete a handshake."""
    context = server_context()
    if client_cas is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_cas.decode())
    handle, name = tempfile.mkstemp(dir=directory, suffix=".pem")
    try:
        with os.fdopen(handle, "wb") as out:  # mkstemp: mode 0600, only this user
            out.write(key_pem + b"\n" + cert_pem)
        context.load_cert_chain(name)
    finally:
        Path(name).unlink(missing_ok=True)
    return context


def context_from_files(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for a pair that is already on disk (a mounted Secret)."""
    context = server_context()
    context.load_cert_chain(cert_file, key_file)
    return context


class SwappableContext:
    """A listening context that serves whichever context was :meth:`set` last; a
    handshake before the first one fails (nothing to serve yet)."""

    def __init__(self, *, require_clients: bool = False) -> None:
        self.current: ssl.SSLContext | None = None
        self.listening = server_context()
        if require_clients:
            self.listening.verify_mode = ssl.CERT_REQUIRED
        self.listening.sni_callback = self._choose

    def set(self, context: ssl.SSLContext) -> None:
        self.current = context

    def _choose(self, connection: Any, _server_name: str | None, _: ssl.SSLContext) -> int | None:
        current = self.current
        if current is None:
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE  # not ready: no certificate yet
        connection.context = current
        return None
