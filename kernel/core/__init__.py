"""The sans-IO cores of the kernel: pure, synchronous logic with no event loop,
no sockets and no clock of their own (time is passed in).

* :mod:`.request_registry` -- the request map and each request's
  ``ControlRequest`` machine, ranks released for sending only once marked Sent;
  cleanup on every path, bounded tombstones.
* :mod:`.request_id` -- request ids never reused (incarnation + counter).
* :mod:`.admission_queue` -- strict FIFO admission by hand-off (fan-out mailbox).
* :mod:`.fan_out_policy`, :mod:`.fan_out_result` -- when a fan-out is decided,
  and what it returns.
* :mod:`.peer_table` -- each rank's ``PeerLink`` machine: connected, busy,
  stalled, suspect, lost; incarnations and fencing.
* :mod:`.membership` -- which ranks are present (add/remove/update events with
  revisions and incarnations) and admitted; why a present rank is not routable.
* :mod:`.inbound_core` -- the engine's admission and completion of received
  requests: every ``InboundRequest`` transition, in one place.
* :mod:`.result_cache` -- the engine's idempotency cache (bounded in entries and
  bytes, keys scoped by peer and method, outcomes kept for their retry window).
* :mod:`.duplicate_filter` -- request ids an engine has seen, per peer (bounded).
* :mod:`.operation_core`, :mod:`.operation_plan`, :mod:`.operation_result` --
  coordinated multi-step operations with compensation.
* :mod:`.fencing` -- fencing tokens: minting them; the engine's fence (a
  token's range, when it moves).

The anyio shells that drive them live in :mod:`ctlwire.kernel.client` (client,
mailbox), :mod:`ctlwire.kernel.engine` (endpoint) and :mod:`ctlwire.kernel`
(runner); the interleaving explorer (:mod:`ctlwire.testing.interleaving`)
drives these same cores directly.
"""
