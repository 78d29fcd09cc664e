"""Tools for testing engines and callers built on ctlwire (like ``trio.testing``).

Import them from here; the modules behind this facade are private::

    from ctlwire.testing import EngineHarness, TransitionRecorder, virtual_backend

* :class:`EngineHarness` -- N engine ranks and a ``ControlClient`` joined by the
  in-memory transport, in one event loop;
* :class:`TransitionRecorder` -- records the states every request went through;
* :class:`VirtualTimeEventLoop`, :func:`virtual_backend`, :func:`on_virtual_clock`
  -- virtual clocks on asyncio and trio (a 600 s timeout in milliseconds);
* :func:`free_tcp_address`, :func:`free_tcp_port` -- tcp ports for engines that bind.

Public sub-modules, each the documented home of what it holds:

* :mod:`ctlwire.testing.pytest_plugin` -- the pytest plugin (``pytest11``
  entry point): fixtures ``ctlwire_harness``, ``transition_recorder``,
  ``ctlwire_virtual_backend``; mark ``ctlwire_virtual_clock``;
* :mod:`ctlwire.testing.interleaving` -- the exhaustive interleaving
  explorer of the request registry and the fan-out mailbox's cores
  (``python -m ctlwire.testing.interleaving``);
* :mod:`ctlwire.testing.operation_explorer` -- the same for the operation
  coordinator (``python -m ctlwire.testing.operation_explorer``).

Fault injection wraps transports and needs nothing of the kernel, so it lives
with them: :mod:`ctlwire.testing.faults`.

Names are imported on first use, so loading the pytest plugin (which imports
this package) does not import the client, the endpoint or anyio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctlwire.transports._lazy_exports import lazy_exports

# The one list of exported names (see ctlwire.transports._lazy_exports): __all__
# and the lazy imports are derived from it; type checkers read it as re-exports.
if TYPE_CHECKING:
    from ctlwire.testing._harness import EngineHarness as EngineHarness
    from ctlwire.testing._ports import free_tcp_address as free_tcp_address
    from ctlwire.testing._ports import free_tcp_port as free_tcp_port
    from ctlwire.testing._recorder import TransitionRecorder as TransitionRecorder
    from ctlwire.testing._virtual_clock import (
        VIRTUAL_HEARTBEAT_INTERVAL as VIRTUAL_HEARTBEAT_INTERVAL,
    )
    from ctlwire.testing._virtual_clock import VirtualTimeEventLoop as VirtualTimeEventLoop
    from ctlwire.testing._virtual_clock import on_virtual_clock as on_virtual_clock
    from ctlwire.testing._virtual_clock import virtual_backend as virtual_backend

if not TYPE_CHECKING:  # type checkers see the names above, and no catch-all __getattr__
    __getattr__, __dir__ = lazy_exports(globals())
