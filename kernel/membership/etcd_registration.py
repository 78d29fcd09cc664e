"""An engine's registration in etcd: ``PREFIX<rank>`` under a lease, kept alive
(anyio shell; needs ``httpx``: the ``etcd`` extra).

::

    gateway = EtcdGateway("http://127.0.0.1:2379", timeout=2.0)
    registration = EtcdRegistration(gateway, "/fleet/a/", 3, "tcp://h:5555", ttl=10,
                                    incarnation=endpoint.incarnation)
    tg.start_soon(registration.run)
    ...
    await registration.withdraw()          # a clean stop: the client removes the rank

The value is the JSON of :class:`Registration`: the rank, the address clients
reach it at, and the engine process's incarnation (the one its heartbeats and
replies carry).

Guarantees:

* **A lost lease is renewed, not a new member.** The lease is kept alive every
  ``ttl / 3``. When etcd says it is gone (it expired while etcd was frozen,
  unreachable or changing leader) the engine registers again at once under a
  new lease with the *same* incarnation: the client sees the registration
  restored, not a new process, and keeps its admission. While etcd does not
  answer, the engine keeps serving and retries every ``retry_interval``, so it
  registers again as soon as etcd answers. Nothing the engine runs depends on
  etcd.
* **An explicit removal holds.** Each round the engine reads its key back, then
  keeps the lease alive. Gone while its lease lives: an operator removed it;
  the engine stops registering (``status`` ``"removed"``) until it is
  restarted. Held by a newer incarnation of its rank: this process is the stale
  one; it stops (``"superseded"``). Held by an older incarnation (a thawed
  predecessor wrote it back): it writes its own again (``rewritten``). Every
  write is conditional on the key's revision as read, so a write etcd applies
  after its caller gave up (a slow or frozen member) cannot overwrite a newer
  one.
* **A clean stop is a deregistration.** :meth:`withdraw` deletes the key while
  it is held under this registration's lease (one transaction) and leaves the
  lease to expire: the client, finding the lease still alive, tells it from a
  lease loss and removes the rank at once.
"""

from __future__ import annotations

import binascii
import logging
from typing import Annotated, Any, Literal

import anyio
import msgspec

from ctlwire.kernel.engine.liveness import new_incarnation
from ctlwire.kernel.membership.etcd_gateway import EtcdError, EtcdGateway, unb64

__all__ = ["MAX_RANK", "MAX_VALUE_BYTES", "EtcdRegistration", "Registration",
           "decode_registration", "rank_of_key"]

log = logging.getLogger("ctlwire.engine")

#: the largest registration value accepted (a registration is a few dozen bytes)
MAX_VALUE_BYTES = 4096
#: the largest rank a key may name (a transport routes ranks of at most 9 digits)
MAX_RANK = 999_999_999


class Registration(msgspec.Struct):
    """What ``PREFIX<rank>`` holds: strictly typed (a bool or float is not a rank), the
    incarnation a signed 64-bit number >= 0 (0: not given). Fields a later version
    adds are ignored."""

    rank: Annotated[int, msgspec.Meta(ge=0)]
    address: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    incarnation: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0


_decoder = msgspec.json.Decoder(Registration)
_encoder = msgspec.json.Encoder()


def rank_of_key(key: str, prefix: str, max_rank: int = MAX_RANK) -> int | None:
    """The rank ``key`` names: ``prefix`` then the rank in decimal, one spelling per
    rank (no sign, space or leading zero: ``03`` is not rank 3), at most
    ``max_rank``. None for any other key."""
    if not key.startswith(prefix):
        return None
    digits = key[len(prefix):]
    if not (0 < len(digits) <= 9 and digits.isascii() and digits.isdigit()):
        return None
    rank = int(digits)
    return rank if str(rank) == digits and rank <= max_rank else None


def decode_registration(value_b64: Any, rank: int,
                        max_bytes: int = MAX_VALUE_BYTES) -> Registration:
    """The registration a base64 value holds for ``rank``. ValueError when it is too
    large, not base64 JSON of a :class:`Registration`, or names another rank."""
    if not isinstance(value_b64, str):
        raise ValueError("the value is not a string")
    if len(value_b64) > (max_bytes + 2) // 3 * 4:
        raise ValueError(f"the value is larger than {max_bytes} bytes")
    try:
        reg = _decoder.decode(unb64(value_b64))
    except (msgspec.DecodeError, UnicodeDecodeError, binascii.Error) as exc:
        raise ValueError(f"not a registration: {exc}") from None
    if reg.rank != rank:
        raise ValueError(f"the value names rank {reg.rank}, its key rank {rank}")
    return reg


def _revision(kv: dict[str, Any] | None) -> int:
    """The mod revision of ``kv`` (0: absent)."""
    return 0 if kv is None else int(kv.get("mod_revision", 0))


Status = Literal["unregistered", "registered", "removed", "superseded", "withdrawn"]


class EtcdRegistration:
    """An engine's registration, as described above. ``counters``:
    ``registered`` (each lease it put its key under), ``lease_lost``,
    ``keep_alives``, ``rewritten``, ``errors``. ``incarnation`` defaults to a new
    one; give the engine's own."""

    def __init__(self, gateway: EtcdGateway, prefix: str, rank: int, address: str, *,
                 ttl: float = 10.0, incarnation: int = 0,
                 retry_interval: float | None = None) -> None:
        if not ttl >= 1:
            raise ValueError("ttl must be >= 1 (seconds)")
        if not 0 <= rank <= MAX_RANK:
            raise ValueError(f"rank must be in 0..{MAX_RANK}")
        self.gateway = gateway
        self.rank = rank
        self.key = f"{prefix}{rank}"
        self.incarnation = incarnation or new_incarnation()
        self.value = _encoder.encode(Registration(rank, address, self.incarnation)).decode()
        self.ttl = ttl
        self.interval = ttl / 3
        self.retry_interval = (min(1.0, ttl / 4) if retry_interval is None
                               else retry_interval)
        self.lease = 0
        self.status: Status = "unregistered"
        self.counters = {"registered": 0, "lease_lost": 0, "keep_alives": 0, "rewritten": 0,
                         "errors": 0}

    async def register(self) -> bool:
        """A new lease and the key under it (same incarnation), unless a newer
        incarnation holds the key (False: superseded). The put is conditional on
        the key as read: EtcdError when it changed meanwhile (try again)."""
        kv = await self.gateway.get(self.key)
        if kv is not None and self._owner(kv) > self.incarnation:
            return self._superseded()
        lease = await self.gateway.grant(self.ttl)
        if not await self.gateway.put_if(self.key, self.value, lease, _revision(kv)):
            raise EtcdError(f"{self.key} changed while registering")
        self.lease = lease
        self.status = "registered"
        self.counters["registered"] += 1
        return True

    async def run(self) -> None:
        """Register, then keep the registration until cancelled, removed or
        superseded (see the module docstring); retry while etcd does not answer."""
        while True:
            try:
                if not await self._round():
                    return
                wait = self.interval
            except EtcdError as exc:
                self.counters["errors"] += 1
                log.debug("ctlwire: etcd registration of %s: %s", self.key, exc)
                wait = self.retry_interval
            await anyio.sleep(wait)

    async def _round(self) -> bool:
        """One keep-alive round; False once the registration is over. The key is read
        before the lease is kept alive: a key found gone under a lease alive after
        it was gone was deleted, not expired."""
        if not self.lease:
            return await self.register()
        kv = await self.gateway.get(self.key)
        if await self.gateway.keep_alive(self.lease) <= 0:
            self.counters["lease_lost"] += 1
            log.warning("ctlwire: etcd lease of %s lost; registering again (same "
                        "incarnation)", self.key)
            self.lease = 0
            return await self.register()
        self.counters["keep_alives"] += 1
        if kv is None:
            self.status = "removed"
            log.warning("ctlwire: %s was deleted while its lease lives (an explicit "
                        "removal); not registering again", self.key)
            return False
        owner = self._owner(kv)
        if owner > self.incarnation:
            return self._superseded()
        stale = owner < self.incarnation or int(kv.get("lease", 0)) != self.lease
        if stale and await self.gateway.put_if(self.key, self.value, self.lease, _revision(kv)):
            self.counters["rewritten"] += 1
        return True

    def _superseded(self) -> bool:
        self.status = "superseded"
        log.warning("ctlwire: %s is held by a newer incarnation of rank %d; this "
                    "process stops registering", self.key, self.rank)
        return False

    def _owner(self, kv: dict[str, Any]) -> int:
        """The incarnation ``kv`` registers (-1: not a valid registration)."""
        try:
            return decode_registration(kv.get("value", ""), self.rank).incarnation
        except ValueError:
            return -1

    async def withdraw(self) -> None:
        """Deregister: delete the key while it is held under this registration's
        lease; the lease is left to expire (so the client tells a deregistration
        from a lease loss)."""
        lease, self.lease = self.lease, 0
        if self.status == "registered":
            self.status = "withdrawn"
        if lease:
            await self.gateway.delete(self.key, lease=lease)
