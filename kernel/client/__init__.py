"""The client side of the kernel: the anyio shells an API server runs.

* :mod:`.control_client` -- :class:`ControlClient`, the public API: calls,
  fan-outs, ranks, lifetime.
* :mod:`.call_issuer` -- one call's IO over the sans-IO request map: register,
  send, wait.
* :mod:`.call_outcome` -- each holder's decoded value or typed error.
* :mod:`.fan_out_mailbox` -- per-method admission: queueing (FIFO) or watching.
* :mod:`.deadline_reaper` -- one task that ends every wait at its deadline.
* :mod:`.receiver` -- the receive loop: frames to the request map and peer table;
  where a call waits (a caller of one rank waiting alone receives its own reply).
* :mod:`.waiting_sends` -- sends that wait for room or a rank's first contact.
* :mod:`.rank_roster` -- which ranks are present, alive, admissible.
* :mod:`.retry_policy`, :mod:`.progress_callbacks`, :mod:`.call_arguments`.

The cores they drive live in :mod:`ctlwire.kernel.core`. Names are imported
from :mod:`ctlwire.kernel` (``from ctlwire.kernel import ControlClient``).
"""
