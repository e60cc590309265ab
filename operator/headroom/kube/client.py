"""The real API server behind :class:`~headroom.kube.transport.Transport`, over aiohttp.

Why not the official client: it is synchronous, so every call from an async
handler would need a thread, and its model deserialization costs more CPU than
the call itself. kopf already brings aiohttp; this wraps it with the same
credentials the official client's loader finds (kubeconfig or in-cluster), so
kopf and Headroom authenticate identically. Bodies are plain JSON dicts; the
typed layer above builds them from the pydantic models.

A bearer token that comes from a file (a pod's projected service-account token, which
the kubelet replaces before it expires, within the hour) is read again every
:data:`TOKEN_PERIOD`, and at once after a 401, as client-go's ``cachingTokenSource``
does: a token read once at start stops working when it expires, or at the latest
when its bound pod goes. The read is in a thread (a file, off the event loop).

Every request that fails is told to ``on_error(verb, code)`` (the
``headroom_api_errors_total`` metric): the verb as Kubernetes names it (get, list,
watch, create, update, patch, delete) and the HTTP status, or ``timeout`` /
``connection`` when no answer came.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp

from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, list_all

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
#: What aiohttp raises when there is no answer; the transport says ApiUnavailableError.
_NO_ANSWER = (aiohttp.ClientError, TimeoutError, OSError)
#: A pod's projected service-account token (the in-cluster loader's), rotated by the kubelet.
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
#: How long a token read from a file is used before it is read again (client-go's).
TOKEN_PERIOD = 60.0
#: The Kubernetes verb of each HTTP method (a GET with a limit is a list: ``list_page``).
_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are."""

    server: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token: str | None = None
    verify: bool = True
    #: Where ``token`` was read from, to be read again (None: it never changes).
    token_file: str | None = None

    @classmethod
    def from_environment(cls) -> Credentials:
        """In-cluster service account if present, else the current kubeconfig context.

        Uses the official client's loader (blocking file reads, once at start).
        """
        from kubernetes import client, config

        token_file = None
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            token_file = SERVICE_ACCOUNT_TOKEN
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        conf = client.Configuration.get_default_copy()
        token = conf.api_key.get("authorization") or conf.api_key.get("BearerToken")
        if token and not token.lower().startswith("bearer "):
            token = f"Bearer {token}"
        return cls(
            server=conf.host,
            ca_file=conf.ssl_ca_cert,
            cert_file=conf.cert_file,
            key_file=conf.key_file,
            token=token,
            verify=conf.verify_ssl,
            token_file=token_file,
        )

    def read_token(self) -> str | None:
        """The bearer token now (``Bearer …``): the file's if there is one (blocking: call
        it in a thread), else the one given; None if the file cannot be read (the caller
        keeps the last good one)."""
        if self.token_file is None:
            return self.token
        try:
            with open(self.token_file, encoding="utf-8") as file:
                value = file.read().strip()
        except OSError:
            return None
        return f"Bearer {value}" if value else None

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        context = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file and self.key_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


class BearerToken:
    """The ``Authorization`` header, read again from its file every ``period`` seconds,
    and on the next request after a 401."""

    def __init__(self, credentials: Credentials, period: float = TOKEN_PERIOD) -> None:
        self._credentials, self._period = credentials, period
        self._value = credentials.token
        self._read_at = time.monotonic()

    async def header(self) -> str | None:
        if self._credentials.token_file is not None and (
            time.monotonic() - self._read_at >= self._period
        ):
            self._read_at = time.monotonic()
            self._value = await asyncio.to_thread(self._credentials.read_token) or self._value
        return self._value

    def unauthorized(self) -> None:
        """A 401: the token may have been replaced (and the old one revoked); read it now."""
        self._read_at = -float("inf")


class KubeClient:
    """One connection pool to one API server. Create inside the running loop."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        timeout: float = 30.0,
        connections: int = 64,
        user_agent: str = "headroom-operator",
        on_error: Callable[[str, str], None] | None = None,
        token_period: float = TOKEN_PERIOD,
    ) -> None:
        """``on_error(verb, code)``: told of every request that failed (see the module).
        ``token_period``: how long a token from a file is used before it is read again."""
        self.credentials = credentials
        self._on_error = on_error
        self._token = BearerToken(credentials, token_period)
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        self._session = aiohttp.ClientSession(
            base_url=credentials.server.rstrip("/") + "/",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
            connector=aiohttp.TCPConnector(ssl=credentials.ssl_context(), limit=connections),
            json_serialize=json.dumps,
        )
        self.calls = 0

    async def close(self) -> None:
        await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str | int] | None = None,
        content_type: str = "application/json",
        verb: str | None = None,
    ) -> JSON:
        """Send one request; the decoded JSON answer, ApiError, or ApiUnavailableError."""
        verb = verb or _VERBS.get(method, method.lower())
        url = path.lstrip("/")
        if params:
            url += "?" + urlencode(params)
        data = None if body is None else json.dumps(body)
        headers = await self._headers()
        if data is not None:
            headers["Content-Type"] = content_type
        self.calls += 1
        try:
            async with self._session.request(method, url, data=data, headers=headers) as response:
                text = await response.text()
                if response.status >= 300:
                    self._failed(verb, str(response.status))
                    raise _api_error(response.status, text)
                return json.loads(text) if text else {}
        except _NO_ANSWER as error:
            self._failed(verb, _no_answer(error))
            raise ApiUnavailableError(f"{method} {path}: {error!r}") from error

    async def _headers(self) -> dict[str, str]:
        token = await self._token.header()
        return {"Authorization": token} if token else {}

    def _failed(self, verb: str, code: str) -> None:
        if code == "401":
            self._token.unauthorized()
        if self._on_error is not None:
            self._on_error(verb, code)

    async def get(self, path: str) -> JSON:
        return await self.request("GET", path)

    async def create(self, path: str, body: JSON) -> JSON:
        return await self.request("POST", path, body=body)

    async def replace(self, path: str, body: JSON) -> JSON:
        return await self.request("PUT", path, body=body)

    async def merge_patch(self, path: str, body: JSON) -> JSON:
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        return await self.request("PATCH", path, body=operations, content_type=JSON_PATCH)

    async def delete(self, path: str, *, uid: str | None = None) -> JSON:
        """Delete; with ``uid``, only that incarnation of the object (precondition)."""
        body = {"preconditions": {"uid": uid}} if uid else None
        return await self.request("DELETE", path, body=body)

    async def list_page(
        self,
        path: str,
        *,
        limit: int = 500,
        continue_token: str | None = None,
        label_selector: str | None = None,
    ) -> JSON:
        params: dict[str, str | int] = {"limit": limit}
        if continue_token:
            params["continue"] = continue_token
        if label_selector:
            params["labelSelector"] = label_selector
        return await self.request("GET", path, params=params, verb="list")

    async def list_all(
        self, path: str, *, limit: int = 500, label_selector: str | None = None
    ) -> tuple[list[JSON], str]:
        """Every item of a paged LIST and the list's resourceVersion."""
        return await list_all(self, path, limit=limit, label_selector=label_selector)

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 270,
    ) -> AsyncIterator[JSON]:
        """Yield the events of one WATCH from ``resource_version`` until the server ends it.

        Bookmarks are asked for so that a quiet watch still advances its version. The
        read timeout is the server's plus a margin: a silent, dead connection ends
        in ApiUnavailableError instead of hanging.
        """
        params: dict[str, str | int] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        if label_selector:
            params["labelSelector"] = label_selector
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
        url = path.lstrip("/") + "?" + urlencode(params)
        self.calls += 1
        try:
            headers = await self._headers()
            async with self._session.get(url, timeout=timeout, headers=headers) as response:
                if response.status >= 300:
                    self._failed("watch", str(response.status))
                    raise _api_error(response.status, await response.text())
                pending = b""
                async for chunk in response.content.iter_any():
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
        except _NO_ANSWER as error:
            self._failed("watch", _no_answer(error))
            raise ApiUnavailableError(f"WATCH {path}: {error!r}") from error
        except ValueError as error:  # a torn line: the connection broke mid-event
            self._failed("watch", "connection")
            raise ApiUnavailableError(f"WATCH {path}: {error!r}") from error


def _no_answer(error: BaseException) -> str:
    """``timeout`` (aiohttp's timeouts are TimeoutErrors) or ``connection``."""
    return "timeout" if isinstance(error, TimeoutError) else "connection"


def _api_error(status: int, text: str) -> ApiError:
    try:
        payload = json.loads(text)
        return ApiError(status, payload.get("reason", ""), payload.get("message", text))
    except (ValueError, AttributeError):
        return ApiError(status, "", text[:500])
