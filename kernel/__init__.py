"""The ctlwire kernel: drives the state tables of :mod:`ctlwire.states` over the
transports of :mod:`ctlwire.transports` on anyio (asyncio or trio)."""
