"""Membership on etcd v3: engines register under a prefix with a lease; clients
list and watch the prefix (anyio shell; needs ``httpx``: the ``etcd`` extra).

::

    gateway = EtcdGateway("http://127.0.0.1:2379")
    # engine side: rank 3 at its address, kept alive at TTL/2
    tg.start_soon(EtcdRegistration(gateway, "/fleet/a/", 3, "tcp://h:5555", ttl=10).run)
    # client side: the client's ranks follow the prefix
    tg.start_soon(EtcdMembership(client, gateway, "/fleet/a/").run)

It speaks etcd's JSON gateway (``/v3/kv/range``, ``/v3/watch``, ``/v3/lease/...``)
over httpx, which runs on asyncio and trio alike (a ``grpc.aio`` client would
tie the client to asyncio).

Guarantees:

* **A registration is a lease.** :class:`EtcdRegistration` grants a lease of
  ``ttl`` seconds, puts ``PREFIX<rank>`` with it and keeps it alive every
  ``ttl / 2``. When etcd says the lease is gone (expired in an outage, revoked)
  it registers again under a new lease: a new key, so a new *incarnation* (the
  key's create revision), which fences the old one. While etcd is unreachable
  the engine keeps serving and retries; nothing it runs depends on etcd.
* **The client's view follows the prefix, by revision.** :class:`EtcdMembership`
  lists the prefix, applies it (ranks not listed are removed, at the list's
  revision), then watches from the next revision. Each key's create revision
  is its incarnation and its mod revision the event's revision, so events the
  membership already applied are stale and ignored. It lists again when the
  watch reports compaction, on any watch error, and every ``relist_interval``
  seconds (a watch that went quiet without an error cannot hide a change
  longer than that).
* **Lease expiry removes the rank** (etcd deletes the key: the watch reports it).
* **Unreachable etcd keeps the last view**: ``membership.stale`` says why and
  since when it is stale (and ``stale_since`` on this object), until a list
  succeeds again. Nothing is removed because etcd cannot be reached.
* **Bad entries are counted, not applied** (``bad_entries``): a key whose suffix
  is not a rank, a value that is not the registration's JSON.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio

from ctlwire.kernel.core.membership import MembershipEvent
from ctlwire.kernel.errors import CtlwireError

if TYPE_CHECKING:
    import httpx

    from ctlwire.kernel.client.control_client import ControlClient

__all__ = ["Compacted", "EtcdError", "EtcdGateway", "EtcdMembership", "EtcdRegistration"]

log = logging.getLogger("ctlwire.client")  # the client's view of the membership
engine_log = logging.getLogger("ctlwire.engine")  # an engine's registration


class EtcdError(CtlwireError):
    """etcd could not be reached, or answered with an error (``code``: its gRPC
    status code, None when it could not be reached)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        self.code = code
        super().__init__(message)


#: etcd's gRPC status code for a lease (or key) that does not exist
_NOT_FOUND = 5


class Compacted(EtcdError):
    """The watch's start revision was compacted away: list again."""

    def __init__(self, compact_revision: int) -> None:
        self.compact_revision = compact_revision
        super().__init__(f"revision compacted (compact revision {compact_revision})")


def _b64(data: str) -> str:
    return base64.b64encode(data.encode()).decode()


def _unb64(data: str) -> str:
    return base64.b64decode(data).decode()


def _prefix_end(prefix: str) -> str:
    """The range end of every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return base64.b64encode(b"\0").decode()
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


class EtcdGateway:
    """The few etcd v3 calls membership needs, over the JSON gateway (httpx)."""

    def __init__(self, endpoint: str, *, timeout: float = 5.0) -> None:
        import httpx

        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self._httpx = httpx

    def _client(self, timeout: Any = None) -> httpx.AsyncClient:
        # plain http needs no TLS context (loading the CA bundle costs more than the call)
        return self._httpx.AsyncClient(base_url=self.endpoint,
                                       timeout=self.timeout if timeout is None else timeout,
                                       verify=self.endpoint.startswith("https:"))

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>``; the answer, or EtcdError."""
        try:
            async with self._client() as http:
                resp = await http.post(f"/v3/{path}", json=body)
            answer = resp.json()
        except (self._httpx.HTTPError, ValueError) as exc:
            raise EtcdError(f"{path}: {exc!r}") from exc
        if not isinstance(answer, dict) or "error" in answer or resp.status_code != 200:
            code = answer.get("code") if isinstance(answer, dict) else None
            raise EtcdError(f"{path}: {answer!r}"[:300], code if type(code) is int else None)
        return answer

    async def grant(self, ttl: float) -> int:
        answer = await self.call("lease/grant", {"TTL": max(1, math.ceil(ttl))})
        return int(answer["ID"])

    async def keep_alive(self, lease: int) -> int:
        """Refresh ``lease`` once; its remaining TTL (0: the lease is gone)."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """Revoke ``lease`` (its keys go with it); one already gone is not an error."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if exc.code != _NOT_FOUND:
                raise

    async def put(self, key: str, value: str, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = await self.call("kv/put", body)
        return int(answer["header"]["revision"])

    async def list_prefix(self, prefix: str) -> tuple[int, list[dict[str, Any]]]:
        """The store's revision and every key-value under ``prefix``."""
        answer = await self.call("kv/range", {"key": _b64(prefix),
                                              "range_end": _prefix_end(prefix)})
        return int(answer["header"]["revision"]), list(answer.get("kvs", []))

    async def compact(self, revision: int) -> None:
        await self.call("kv/compaction", {"revision": str(revision)})

    async def watch(self, prefix: str, start_revision: int
                    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The events under ``prefix`` from ``start_revision``, a batch at a time.
        Raises Compacted, or EtcdError when the stream fails or ends."""
        body = {"create_request": {"key": _b64(prefix), "range_end": _prefix_end(prefix),
                                   "start_revision": str(start_revision)}}
        timeout = self._httpx.Timeout(self.timeout, read=None)
        try:
            async with (self._client(timeout) as http,
                        http.stream("POST", "/v3/watch", json=body) as resp):
                if resp.status_code != 200:
                    raise EtcdError(f"watch: HTTP {resp.status_code}")
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    message = json.loads(line)
                    result = message.get("result")
                    if not isinstance(result, dict):
                        raise EtcdError(f"watch: {message!r}"[:300])
                    if result.get("compact_revision"):
                        raise Compacted(int(result["compact_revision"]))
                    if result.get("canceled"):
                        raise EtcdError(f"watch canceled: {result!r}"[:300])
                    events = result.get("events")
                    if events:
                        yield events
        except (self._httpx.HTTPError, ValueError) as exc:
            raise EtcdError(f"watch: {exc!r}") from exc
        raise EtcdError("watch: the stream ended")


class EtcdRegistration:
    """An engine's registration: ``PREFIX<rank>`` -> ``{"rank", "address"}`` under a
    lease kept alive at ``ttl / 2``; see the module docstring. ``counters``:
    ``registered`` (each new incarnation), ``keep_alives``, ``errors``."""

    def __init__(self, gateway: EtcdGateway, prefix: str, rank: int, address: str, *,
                 ttl: float = 10.0) -> None:
        if not ttl >= 1:
            raise ValueError("ttl must be >= 1 (seconds)")
        self.gateway = gateway
        self.key = f"{prefix}{rank}"
        self.value = json.dumps({"rank": rank, "address": address})
        self.ttl = ttl
        self.lease = 0
        self.counters = {"registered": 0, "keep_alives": 0, "errors": 0}

    async def register(self) -> None:
        """A new lease and the key under it: a new incarnation."""
        lease = await self.gateway.grant(self.ttl)
        await self.gateway.put(self.key, self.value, lease)
        self.lease = lease
        self.counters["registered"] += 1

    async def run(self) -> None:
        """Register, then keep the lease alive every ``ttl / 2`` until cancelled;
        register again when the lease is gone; retry while etcd is unreachable."""
        while True:
            try:
                if not self.lease:
                    await self.register()
                elif await self.gateway.keep_alive(self.lease) > 0:
                    self.counters["keep_alives"] += 1
                else:
                    engine_log.warning("ctlwire: etcd lease of %s lost; registering again",
                                       self.key)
                    self.lease = 0
                    continue
            except EtcdError as exc:
                self.counters["errors"] += 1
                engine_log.debug("ctlwire: etcd registration of %s: %s", self.key, exc)
            await anyio.sleep(self.ttl / 2)

    async def withdraw(self) -> None:
        """Revoke the lease (the key goes with it): a clean leave."""
        if self.lease:
            lease, self.lease = self.lease, 0
            await self.gateway.revoke(lease)


class EtcdMembership:
    """Feeds ``client``'s membership from ``prefix``; see the module docstring.
    ``counters``: ``lists``, ``watch_events``, ``compacted``, ``errors``,
    ``bad_entries``."""

    def __init__(self, client: ControlClient, gateway: EtcdGateway, prefix: str, *,
                 relist_interval: float = 30.0, retry_interval: float = 1.0) -> None:
        self.client = client
        self.gateway = gateway
        self.prefix = prefix
        self.relist_interval = relist_interval
        self.retry_interval = retry_interval
        self.stale_since: float | None = None
        self.counters = {"lists": 0, "watch_events": 0, "compacted": 0, "errors": 0,
                         "bad_entries": 0}
        #: set each time a list has been applied (tests and callers can wait on it)
        self.listed = anyio.Event()

    def _event(self, kind: str, kv: dict[str, Any]) -> MembershipEvent | None:
        try:
            key = _unb64(kv["key"])
            rank = int(key[len(self.prefix):])
            revision = int(kv["mod_revision"])
            if kind == "remove":
                return MembershipEvent("remove", rank, revision=revision)
            value = json.loads(_unb64(kv["value"]))
            if not isinstance(value, dict) or value.get("rank") != rank:
                raise ValueError("the value does not name the key's rank")
            address = value.get("address", "")
            if not isinstance(address, str):
                raise ValueError("address is not a string")
            return MembershipEvent("add", rank, address, int(kv["create_revision"]), revision)
        except (KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
            self.counters["bad_entries"] += 1
            log.debug("ctlwire: etcd membership entry refused: %r (%s)", kv, exc)
            return None

    def _apply(self, event: MembershipEvent | None) -> None:
        if event is None:
            return
        try:
            self.client.apply_membership(event)
        except (ValueError, TypeError) as exc:  # e.g. a transport refusing the address
            self.counters["bad_entries"] += 1
            log.warning("ctlwire: membership event %r not applied: %s", event, exc)

    async def relist(self) -> int:
        """List the prefix and make the client's ranks match it; the list's revision."""
        revision, kvs = await self.gateway.list_prefix(self.prefix)
        listed: set[int] = set()
        membership = self.client.membership
        for kv in kvs:
            event = self._event("add", kv)
            if event is None:
                continue
            listed.add(event.rank)
            known = membership.get(event.rank)
            if known is None or known.revision != event.revision:  # else: applied already
                self._apply(event)
        for rank in membership.ranks:
            if rank not in listed:
                self._apply(MembershipEvent("remove", rank, revision=revision))
        self.counters["lists"] += 1
        membership.stale = None
        self.stale_since = None
        self.listed.set()
        self.listed = anyio.Event()
        return revision

    async def _watch(self, start_revision: int) -> None:
        async for events in self.gateway.watch(self.prefix, start_revision):
            for ev in events:
                self.counters["watch_events"] += 1
                kind = "remove" if ev.get("type") == "DELETE" else "add"
                self._apply(self._event(kind, ev.get("kv", {})))

    async def run(self) -> None:
        """List, watch from the list's revision, list again on compaction, on an
        error and every ``relist_interval``; until cancelled."""
        while True:
            try:
                revision = await self.relist()
                with anyio.move_on_after(self.relist_interval):
                    await self._watch(revision + 1)
            except Compacted:
                self.counters["compacted"] += 1
            except EtcdError as exc:
                self.counters["errors"] += 1
                if self.stale_since is None:
                    self.stale_since = anyio.current_time()
                    log.warning("ctlwire: etcd membership stale (keeping the last view): %s",
                                exc)
                self.client.membership.stale = str(exc)[:200]
                await anyio.sleep(self.retry_interval)
