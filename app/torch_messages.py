"""What the torch engine's control methods take (payloads) and raise (errors, whose
``code`` reaches the client), and the gloo helpers both the engine and the trainer
use to form a weight-update group and bound each broadcast."""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import msgspec
import torch.distributed as dist

from ctlwire.kernel.errors import CtlwireError

__all__ = ["DrainTimedOut", "Generate", "GroupSpec", "NoUpdateGroup", "Overloaded", "Pause",
           "Submit", "TensorMeta", "TorchFault", "UpdateFromDisk", "UpdateFromDistributed",
           "WeightTransferFailed", "WeightsRef", "WeightsRefused", "broadcast_options",
           "gloo_group", "gloo_store"]


# -- payloads -------------------------------------------------------------------------
# Every container is bounded while it is decoded (``msgspec.Meta(max_length=...)``):
# no payload within the frame limit holds the engine's interpreter for long.
_Ranks = Annotated[list[int], msgspec.Meta(max_length=65_536)]
_Shape = Annotated[list[int], msgspec.Meta(max_length=32)]
_Prompts = Annotated[list[Annotated[list[int], msgspec.Meta(max_length=8_192)]],
                     msgspec.Meta(max_length=1_024)]

class Pause(msgspec.Struct, frozen=True):
    """``drain`` runs the sequences to completion for at most ``drain_timeout`` s."""

    mode: str = "abort"  # abort | drain | keep
    drain_timeout: float = 30.0


class GroupSpec(msgspec.Struct, frozen=True):
    """Join the trainer's gloo group: the trainer is group rank 0, engine ``ranks[i]``
    is group rank ``i + 1``. ``timeout`` bounds the join and is the group's default."""

    host: str
    port: int
    ranks: _Ranks
    name: str
    timeout: float


class TensorMeta(msgspec.Struct, frozen=True):
    name: str
    shape: _Shape
    dtype: str


class UpdateFromDistributed(msgspec.Struct, frozen=True):
    """Receive ``tensors`` in order by broadcast from group rank 0; each broadcast is
    bounded by ``timeout`` seconds."""

    version: int
    checksum: str
    tensors: Annotated[list[TensorMeta], msgspec.Meta(max_length=65_536)]
    timeout: float


class UpdateFromDisk(msgspec.Struct, frozen=True):
    version: int
    path: str
    checksum: str


class WeightsRef(msgspec.Struct, frozen=True):
    """A weight version and its checksum (``rollback_weights``, ``check_weights``)."""

    version: int
    checksum: str


class Submit(msgspec.Struct, frozen=True):
    prompts: _Prompts
    max_new_tokens: int = 16


class Generate(msgspec.Struct, frozen=True):
    prompts: _Prompts
    new_tokens: int = 8


class TorchFault(msgspec.Struct, frozen=True):
    """``crash_mid_broadcast``: exit after receiving ``after`` tensors of the next update;
    ``hold_gil``: the next step holds the GIL in one native call for ``seconds``."""

    kind: str
    after: int = 0
    seconds: float = 0.0


# -- errors (their ``code`` reaches the client) ---------------------------------------
class WeightsRefused(CtlwireError):
    """New weights were refused (checksum mismatch, unreadable file); old ones kept."""

    code = 422


class WeightTransferFailed(CtlwireError):
    """A collective failed or timed out; old weights kept, this rank's group destroyed."""

    code = 503


class NoUpdateGroup(CtlwireError):
    code = 409


class Overloaded(CtlwireError):
    code = 429


class DrainTimedOut(CtlwireError):
    """``pause(drain)`` could not finish the sequences in time: not paused."""

    code = 504


# -- gloo ----------------------------------------------------------------------------
def gloo_store(host: str, port: int, world_size: int, *, is_master: bool,
               timeout: float) -> Any:
    """A TCPStore for one group's rendezvous (``port`` 0 on the master: any free port)."""
    return dist.TCPStore(host, port, world_size, is_master,  # type: ignore[attr-defined]
                         timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)


def gloo_group(store: Any, name: str, rank: int, world_size: int, timeout: float) -> Any:
    """Join a gloo process group (blocks until every member joined, or ``timeout``)."""
    prefixed = dist.PrefixStore(name, store)  # type: ignore[attr-defined]
    return dist.ProcessGroupGloo(prefixed, rank, world_size,
                                 datetime.timedelta(seconds=timeout))


def broadcast_options(timeout: float) -> Any:
    """Broadcast from group rank 0, bounded by ``timeout`` seconds."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.timeout = datetime.timedelta(seconds=timeout)
    return opts
