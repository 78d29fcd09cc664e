"""The few etcd v3 calls membership needs, over etcd's JSON gateway, against the
client endpoints of a cluster (anyio shell; needs ``httpx``: the ``etcd`` extra).

::

    gateway = EtcdGateway("http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379")
    lease = await gateway.grant(10)
    await gateway.put("/fleet/a/3", '{"rank": 3, ...}', lease)

httpx runs on asyncio and trio alike (a ``grpc.aio`` client would tie the
caller to asyncio).

Guarantees:

* **Bounded.** Every call answers or raises :class:`EtcdError` within
  ``timeout`` seconds per endpoint it tries. A frozen member (SIGSTOP, a stuck
  disk) accepts connections and answers nothing: the timeout covers it.
* **Fails over.** A member that cannot be reached, times out, or answers that it
  cannot serve now (gRPC ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED``: no leader, a
  leader change, a request timed out) is left for the next endpoint of the
  list, each tried at most once per call; the one that answered is tried first
  from then on (``endpoint``; ``counters["failovers"]``). When none answers,
  :class:`EtcdUnavailable`. Any other error answer (a lease not found, a bad
  request) is etcd's word: raised at once, with its gRPC ``code``.
* Calls given an ``endpoint`` (the watch and its probe) go to that member only.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ctlwire.kernel.errors import CtlwireError

if TYPE_CHECKING:
    import httpx

__all__ = ["Compacted", "EtcdError", "EtcdGateway", "EtcdUnavailable", "b64", "unb64"]


class EtcdError(CtlwireError):
    """etcd could not be reached, or answered with an error (``code``: its gRPC
    status code, None when it could not be reached). ``retryable``: another
    member (or a later try) may answer."""

    def __init__(self, message: str, code: int | None = None, *,
                 retryable: bool = False) -> None:
        self.code = code
        self.retryable = retryable
        super().__init__(message)


class EtcdUnavailable(EtcdError):
    """No endpoint of the cluster answered (each unreachable, frozen or without a
    leader), or — from :meth:`EtcdMembership.run` — none did before its
    ``start_timeout``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class Compacted(EtcdError):
    """The watch's start revision was compacted away: list again."""

    def __init__(self, compact_revision: int) -> None:
        self.compact_revision = compact_revision
        super().__init__(f"revision compacted (compact revision {compact_revision})")


#: etcd's gRPC status codes: a lease (or key) that does not exist; answers that
#: another member, or a later try, may not give
NOT_FOUND = 5
_RETRYABLE_CODES = frozenset({4, 14})  # DEADLINE_EXCEEDED, UNAVAILABLE


def b64(data: str) -> str:
    return base64.b64encode(data.encode()).decode()


def unb64(data: str) -> str:
    return base64.b64decode(data, validate=True).decode()


def _prefix_end(prefix: str) -> str:
    """The range end of every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return base64.b64encode(b"\0").decode()
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def _endpoints(endpoints: str | Sequence[str]) -> tuple[str, ...]:
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    found = tuple(e.strip().rstrip("/") for e in items if e.strip())
    if not found:
        raise ValueError("at least one etcd endpoint is needed")
    return found


class EtcdGateway:
    """etcd v3 over the JSON gateway of a cluster's endpoints, as described above.
    ``endpoints``: a list, or one string with commas between them."""

    def __init__(self, endpoints: str | Sequence[str], *, timeout: float = 5.0) -> None:
        import httpx

        if not timeout > 0:
            raise ValueError("timeout must be > 0 (seconds)")
        self.endpoints = _endpoints(endpoints)
        self.timeout = timeout
        self.counters = {"failovers": 0}
        self._preferred = 0
        self._httpx = httpx

    @property
    def endpoint(self) -> str:
        """The endpoint tried first (the last one that answered)."""
        return self.endpoints[self._preferred]

    def failed(self, endpoint: str) -> None:
        """``endpoint`` did not answer: prefer the next one (if it was preferred)."""
        if self.endpoint == endpoint and len(self.endpoints) > 1:
            self._preferred = (self._preferred + 1) % len(self.endpoints)
            self.counters["failovers"] += 1

    def _client(self, endpoint: str, timeout: Any) -> httpx.AsyncClient:
        # plain http needs no TLS context (loading the CA bundle costs more than the call)
        return self._httpx.AsyncClient(base_url=endpoint, timeout=timeout,
                                       verify=endpoint.startswith("https:"))

    async def _post(self, endpoint: str, path: str, body: dict[str, Any],
                    timeout: float) -> dict[str, Any]:
        answer: Any = None
        status = 0
        with anyio.move_on_after(timeout):
            try:
                async with self._client(endpoint, timeout) as http:
                    resp = await http.post(f"/v3/{path}", json=body)
                status = resp.status_code
                answer = resp.json()
            except (self._httpx.HTTPError, ValueError) as exc:
                raise EtcdError(f"{path} at {endpoint}: {exc!r}", retryable=True) from exc
        if status == 0:
            raise EtcdError(f"{path} at {endpoint}: no answer within {timeout:g} s",
                            retryable=True)
        if not isinstance(answer, dict) or "error" in answer or status != 200:
            code = answer.get("code") if isinstance(answer, dict) else None
            code = code if type(code) is int else None
            raise EtcdError(f"{path} at {endpoint}: {answer!r}"[:300], code,
                            retryable=code is None or code in _RETRYABLE_CODES)
        return answer

    async def call(self, path: str, body: dict[str, Any], *, timeout: float | None = None,
                   endpoint: str | None = None) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>``; the answer. With ``endpoint``, that member
        only (EtcdError); else each endpoint at most once, the preferred first
        (EtcdUnavailable when none answers)."""
        limit = self.timeout if timeout is None else timeout
        if endpoint is not None:
            return await self._post(endpoint, path, body, limit)
        errors: list[str] = []
        n = len(self.endpoints)
        for i in range(n):
            at = self.endpoints[(self._preferred + i) % n]
            try:
                answer = await self._post(at, path, body, limit)
            except EtcdError as exc:
                if not exc.retryable:
                    raise
                errors.append(str(exc)[:160])
                self.failed(at)
                continue
            return answer
        raise EtcdUnavailable(f"{path}: no etcd endpoint answered: " + "; ".join(errors))

    # -- leases ----------------------------------------------------------------
    async def grant(self, ttl: float) -> int:
        answer = await self.call("lease/grant", {"TTL": max(1, math.ceil(ttl))})
        return int(answer["ID"])

    async def keep_alive(self, lease: int) -> int:
        """Refresh ``lease`` once; its remaining TTL (0: the lease is gone)."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def lease_alive(self, lease: int, *, timeout: float | None = None) -> bool:
        """Whether ``lease`` still exists: etcd answers TTL -1 for one that does not
        (and leaves the TTL out, as JSON leaves out zeros, for one that has less than
        a second left)."""
        answer = await self.call("lease/timetolive", {"ID": str(lease)}, timeout=timeout)
        return int(answer.get("TTL", 0)) >= 0

    async def revoke(self, lease: int) -> None:
        """Revoke ``lease`` (its keys go with it); one already gone is not an error."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.code != NOT_FOUND:
                raise

    # -- keys ------------------------------------------------------------------
    async def put(self, key: str, value: str, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = await self.call("kv/put", body)
        return int(answer["header"]["revision"])

    async def put_if(self, key: str, value: str, lease: int, mod_revision: int) -> bool:
        """Put ``key`` under ``lease`` only if it was last modified at ``mod_revision``
        (0: only if it is absent), in one transaction; whether it was put. A write
        answered late (after its caller gave up) cannot overwrite a newer one."""
        put: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            put["lease"] = str(lease)
        answer = await self.call("kv/txn", {
            "compare": [{"key": b64(key), "target": "MOD", "result": "EQUAL",
                         "mod_revision": str(mod_revision)}],
            "success": [{"request_put": put}]})
        return bool(answer.get("succeeded"))

    async def get(self, key: str) -> dict[str, Any] | None:
        """The key-value of ``key`` (its ``value`` base64), None when absent."""
        answer = await self.call("kv/range", {"key": b64(key)})
        kvs = answer.get("kvs") or [None]
        return kvs[0] if isinstance(kvs[0], dict) else None

    async def delete(self, key: str, *, lease: int = 0) -> bool:
        """Delete ``key`` (with ``lease``: only while it is held under that lease, in
        one transaction); whether it was deleted."""
        if not lease:
            answer = await self.call("kv/deleterange", {"key": b64(key)})
            return int(answer.get("deleted", 0)) > 0
        answer = await self.call("kv/txn", {
            "compare": [{"key": b64(key), "target": "LEASE", "result": "EQUAL",
                         "lease": str(lease)}],
            "success": [{"request_delete_range": {"key": b64(key)}}]})
        return bool(answer.get("succeeded"))

    async def list_prefix(self, prefix: str) -> tuple[int, list[dict[str, Any]]]:
        """The store's revision and every key-value under ``prefix``."""
        answer = await self.call("kv/range", {"key": b64(prefix),
                                              "range_end": _prefix_end(prefix)})
        return int(answer["header"]["revision"]), list(answer.get("kvs", []))

    async def probe(self, prefix: str, endpoint: str, timeout: float) -> int:
        """A linearizable count of the keys under ``prefix`` at ``endpoint`` only:
        that member is up and in a cluster with a leader. Its revision."""
        answer = await self.call("kv/range", {"key": b64(prefix), "range_end":
                                              _prefix_end(prefix), "count_only": True},
                                 timeout=timeout, endpoint=endpoint)
        return int(answer["header"]["revision"])

    async def compact(self, revision: int) -> None:
        await self.call("kv/compaction", {"revision": str(revision)})

    async def watch(self, prefix: str, start_revision: int, *, endpoint: str | None = None
                    ) -> AsyncGenerator[list[dict[str, Any]], None]:
        """The events under ``prefix`` from ``start_revision`` (a deletion with the
        key-value it deleted, ``prev_kv``), a batch at a time, from ``endpoint``
        (default: the preferred one). Raises Compacted, or EtcdError when the
        stream fails or ends. A stream that goes quiet is not detected here (see
        :meth:`probe`)."""
        at = endpoint or self.endpoint
        body = {"create_request": {"key": b64(prefix), "range_end": _prefix_end(prefix),
                                   "start_revision": str(start_revision), "prev_kv": True}}
        timeout = self._httpx.Timeout(self.timeout, read=None)
        try:
            async with (self._client(at, timeout) as http,
                        http.stream("POST", "/v3/watch", json=body) as resp):
                if resp.status_code != 200:
                    raise EtcdError(f"watch at {at}: HTTP {resp.status_code}", retryable=True)
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    message = json.loads(line)
                    result = message.get("result") if isinstance(message, dict) else None
                    if not isinstance(result, dict):
                        raise EtcdError(f"watch at {at}: {message!r}"[:300], retryable=True)
                    if result.get("compact_revision"):
                        raise Compacted(int(result["compact_revision"]))
                    if result.get("canceled"):
                        raise EtcdError(f"watch canceled at {at}: {result!r}"[:300],
                                        retryable=True)
                    events = result.get("events")
                    if isinstance(events, list) and events:
                        yield events
        except (self._httpx.HTTPError, ValueError) as exc:
            raise EtcdError(f"watch at {at}: {exc!r}", retryable=True) from exc
        raise EtcdError(f"watch at {at}: the stream ended", retryable=True)
