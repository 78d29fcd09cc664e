"""A real engine: a small decoder-only transformer served on CPU by a busy loop.

::

    python -m ctlwire.app.engine_process --rank 0 --connect ADDR \\
        --methods ctlwire.app.torch_engine:register --mode loop

Needs the ``torch`` extra (``pip install 'ctlwire[torch]'``); nothing else in
ctlwire imports this module. :func:`register` builds a :class:`TorchEngine`
(:class:`TinyDecoder`, random weights from a seed, nothing downloaded) and
returns its step: one batched greedy forward over every running sequence, called
by the engine's loop between polls. Under ``--mode loop``
(:class:`~ctlwire.kernel.engine.busy_loop.BusyLoop`) ``get_server_info`` is read-only and
answered from a snapshot the loop publishes, while a step or an update runs; every
other method runs on the loop's thread, between steps (``--mode poll`` works too,
one request at a time).

Methods: ``get_server_info``, ``pause`` (``abort`` / ``drain`` / ``keep`` the
sequences in flight), ``resume``, ``submit`` / ``sequences`` (serving),
``generate`` (greedy decoding of fixed prompts with the live weights),
``init_weights_update_group``, ``update_weights_from_distributed``,
``update_weights_from_disk``, ``rollback_weights``, ``check_weights``,
``destroy_weights_update_group`` and ``arm_fault`` (tests). The weight methods
also run as operation steps through an
:class:`~ctlwire.kernel.engine.operation_ledger.OperationLedger`.

Guarantees:

* **Atomic swap.** New weights are received into a staging copy; they replace
  the live ones in one assignment, on the engine's thread, only once every
  named tensor arrived and the checksum over all of them matches the one the
  sender declared. Otherwise the update raises and the old weights keep
  serving. The previous weights are kept for one ``rollback_weights``.
* **Bounded collectives.** Every collective (joining the group, each
  broadcast) carries a timeout given by the caller (the operation derives it
  from its step's deadline), never gloo's default. A failed or timed-out
  broadcast destroys this rank's group: a group that lost a collective is not
  reused; the next update forms a new one.
* **Aborted by its controller.** A broadcast is waited for in short slices;
  between them the update reads
  :func:`~ctlwire.kernel.engine.step_abort.step_aborted` (the operation's
  controller lost another member of the group, so this collective cannot
  complete) and fails at once like a failed broadcast: old weights kept, group
  left. The abandoned collective still runs in gloo until its own timeout; a
  thread of its own waits for it and then releases the group, so the engine's
  thread never waits for it.
* **Pause means paused.** ``pause`` returns only when no sequence will be
  advanced: ``abort`` ends the running ones with status ``"aborted"``,
  ``drain`` runs them to completion first (inside the call), ``keep`` leaves
  them to continue after ``resume``. While paused the step does nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import torch

from ctlwire.app.torch_messages import (
    DrainTimedOut,
    Generate,
    GroupSpec,
    NoUpdateGroup,
    Overloaded,
    Pause,
    Submit,
    TensorMeta,
    TorchFault,
    UpdateFromDisk,
    UpdateFromDistributed,
    WeightsRef,
    WeightsRefused,
    WeightTransferFailed,
    broadcast_options,
    gloo_group,
    gloo_store,
)
from ctlwire.app.torch_model import (
    DecoderConfig,
    TinyDecoder,
    checksum,
    greedy,
    next_tokens,
    save_weights,
)
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.liveness import report_progress
from ctlwire.kernel.engine.operation_ledger import OperationLedger
from ctlwire.kernel.engine.step_abort import step_aborted
from ctlwire.kernel.errors import CtlwireError

# the model and the messages have modules of their own; re-exported from here
__all__ = ["DecoderConfig", "DrainTimedOut", "Generate", "GroupSpec", "NoUpdateGroup",
           "Overloaded", "Pause", "Submit", "TensorMeta", "TinyDecoder", "TorchEngine",
           "TorchFault", "UpdateFromDisk", "UpdateFromDistributed", "WeightTransferFailed",
           "WeightsRef", "WeightsRefused", "broadcast_options", "checksum", "gloo_group",
           "gloo_store", "greedy", "register", "save_weights"]


ABORT_CHECK_EVERY = 0.1
"""Seconds between two reads of :func:`step_aborted` while a broadcast is waited for."""


class BroadcastAborted(CtlwireError):
    """The operation's controller aborted the update while a broadcast was pending."""


def _release_when_done(group: Any, work: Any) -> None:
    """Wait for an abandoned collective to end (its own timeout at the latest), then
    drop the group: releasing a group blocks while one of its collectives is pending."""
    with contextlib.suppress(Exception):  # its own timeout, or the root's error
        work.wait()
    del group  # released here, on this thread


def _hold_gil(seconds: float) -> None:
    """One native call (``sum`` over a range, in C) that keeps the GIL ~``seconds``."""
    start = time.perf_counter()
    sum(range(1_000_000))
    per_item = (time.perf_counter() - start) / 1_000_000
    sum(range(int(seconds / max(per_item, 1e-9))))


class TorchEngine:
    """One rank: the model, its sequences, its weight-update group; see the module."""

    def __init__(self, rank: int, config: DecoderConfig | None = None, *,
                 max_sequences: int = 256, finished_kept: int = 1024) -> None:
        self.rank = rank
        self.model = TinyDecoder(config or DecoderConfig())
        self.model.eval()
        self.version = 0
        self.checksum = checksum(self.model.state_dict())
        self._previous: tuple[int, str, dict[str, torch.Tensor]] | None = None
        self.paused = False
        self.max_sequences = max_sequences
        self.running: dict[int, tuple[list[int], list[int], int]] = {}  # id -> prompt, out, max
        self.finished: OrderedDict[int, tuple[str, list[int]]] = OrderedDict()
        self.finished_kept = finished_kept
        self._next_id = 0
        self.steps = 0
        self.tokens = 0
        self.step_seconds = 0.0
        self.group: Any = None  # a torch.distributed.ProcessGroupGloo
        self.group_name = ""
        self.group_rank = -1
        self.faults: dict[str, TorchFault] = {}
        #: the last update's engine-side time (s): receiving, checksumming, swapping
        self.last_update: dict[str, float] = {}
        #: how long each weight/pause method last ran here (s), for the time split
        self.handler_seconds: dict[str, float] = {}
        self.counters = {"updates": 0, "refused": 0, "transfer_failures": 0, "rollbacks": 0,
                         "aborted": 0, "groups_formed": 0, "groups_destroyed": 0,
                         "transfers_aborted": 0}
        self.info: dict[str, Any] = {}
        self.publish()

    # -- serving ----------------------------------------------------------------------
    def step(self) -> bool:
        """One batched forward over the running sequences; False when there was none."""
        fault = self.faults.pop("hold_gil", None)
        if fault is not None:
            _hold_gil(fault.seconds)
        if self.paused or not self.running:
            return False
        start = time.perf_counter()
        ids = list(self.running)
        picked = next_tokens(self.model, [p + o for p, o, _ in self.running.values()])
        for sid, tok in zip(ids, picked, strict=True):
            _, out, limit = self.running[sid]
            out.append(tok)
            if len(out) >= limit:
                self._finish(sid, "finished")
        self.steps += 1
        self.tokens += len(ids)
        self.step_seconds += time.perf_counter() - start
        self.publish()
        return True

    def _finish(self, sid: int, status: str) -> None:
        _, out, _ = self.running.pop(sid)
        self.finished[sid] = (status, out)
        while len(self.finished) > self.finished_kept:
            self.finished.popitem(last=False)

    def submit(self, req: Submit) -> list[int]:
        """Queue sequences for greedy decoding; their ids (``sequences`` reads them)."""
        if len(self.running) + len(req.prompts) > self.max_sequences:
            raise Overloaded(f"rank {self.rank}: more than {self.max_sequences} sequences")
        self._check_prompts(req.prompts)
        ids = []
        for p in req.prompts:
            self._next_id += 1
            self.running[self._next_id] = (list(p), [], max(1, req.max_new_tokens))
            ids.append(self._next_id)
        return ids

    def sequences(self, ids: list[int]) -> list[dict[str, Any]]:
        """Each sequence's status (running, finished, aborted, unknown) and tokens."""
        out = []
        for sid in ids:
            if sid in self.running:
                out.append({"id": sid, "status": "running", "tokens": list(self.running[sid][1])})
            elif sid in self.finished:
                status, toks = self.finished[sid]
                out.append({"id": sid, "status": status, "tokens": list(toks)})
            else:
                out.append({"id": sid, "status": "unknown", "tokens": []})
        return out

    def _check_prompts(self, prompts: list[list[int]]) -> None:
        vocab = self.model.config.vocab
        if any(not p or any(not 0 <= t < vocab for t in p) for p in prompts):
            raise ValueError("every prompt needs at least one token, each in the vocabulary")

    def generate(self, req: Generate) -> list[list[int]]:
        """Greedy decoding of ``prompts`` with the live weights (in this call; at most
        ``max_sequences`` prompts and 256 new tokens)."""
        if len(req.prompts) > self.max_sequences or not 0 <= req.new_tokens <= 256:
            raise ValueError(f"at most {self.max_sequences} prompts and 256 new tokens")
        self._check_prompts(req.prompts)
        return greedy(self.model, req.prompts, req.new_tokens)

    def pause(self, req: Pause = Pause()) -> dict[str, Any]:  # noqa: B008 - frozen struct
        if req.mode not in ("abort", "drain", "keep"):
            raise ValueError(f"pause mode {req.mode!r} is not abort, drain or keep")
        if req.mode == "abort":
            for sid in list(self.running):
                self._finish(sid, "aborted")
                self.counters["aborted"] += 1
        elif req.mode == "drain":
            self.paused = False
            deadline = time.monotonic() + req.drain_timeout
            while self.running:
                if time.monotonic() > deadline:
                    raise DrainTimedOut(f"rank {self.rank}: {len(self.running)} sequences "
                                        f"still running after {req.drain_timeout} s; not paused")
                self.step()
        self.paused = True
        return {"rank": self.rank, "paused": True, "running": len(self.running)}

    def resume(self) -> dict[str, Any]:
        self.paused = False
        return {"rank": self.rank, "paused": False}

    def get_server_info(self) -> dict[str, Any]:
        """The status snapshot (weight version and checksum, steps, tokens/s, paused);
        read-only: safe from any thread, it reads a dict the loop replaces whole."""
        return self.info

    def publish(self) -> None:
        """Replace the status snapshot (the loop's thread: after a step that worked
        and after each state-changing method)."""
        self.info = {
            "rank": self.rank, "version": self.version, "checksum": self.checksum,
            "steps": self.steps, "tokens": self.tokens,
            "tokens_per_s": self.tokens / self.step_seconds if self.step_seconds else 0.0,
            "paused": self.paused, "running": len(self.running),
            "group": self.group_name if self.group is not None else "",
            "pid": os.getpid(), "last_update": dict(self.last_update),
            "handler_s": dict(self.handler_seconds), **self.counters}

    # -- weights ----------------------------------------------------------------------
    def _swap(self, version: int, digest: str, state: dict[str, torch.Tensor]) -> None:
        live = {k: v.detach() for k, v in self.model.state_dict().items()}  # assign: not copied
        self.model.load_state_dict(state, strict=True, assign=True)
        self._previous = (self.version, self.checksum, live)
        self.version, self.checksum = version, digest
        self.counters["updates"] += 1

    def _check_layout(self, layout: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        """Refuse weights whose names, shapes or dtypes are not the model's (checked
        before anything is received or swapped: a partial load is never possible)."""
        live = {k: (tuple(v.shape), str(v.dtype)) for k, v in self.model.state_dict().items()}
        if dict(layout) != live:
            wrong = sorted(set(layout) ^ set(live)) or sorted(
                k for k in live if layout[k] != live[k])
            raise WeightsRefused(f"rank {self.rank}: tensors do not match the model "
                                 f"({', '.join(wrong[:3])})")

    def init_weights_update_group(self, spec: GroupSpec) -> dict[str, Any]:
        """Join (or re-form) the gloo group with the trainer; bounded by ``spec.timeout``."""
        if not spec.timeout > 0:
            raise ValueError("the group's timeout must be > 0")
        if self.rank not in spec.ranks:
            raise ValueError(f"rank {self.rank} is not in the group's ranks {spec.ranks}")
        self.destroy_weights_update_group()
        size = len(spec.ranks) + 1
        store = gloo_store(spec.host, spec.port, size, is_master=False, timeout=spec.timeout)
        rank = spec.ranks.index(self.rank) + 1
        self.group = gloo_group(store, spec.name, rank, size, spec.timeout)
        self.group_name, self.group_rank = spec.name, rank
        self.counters["groups_formed"] += 1
        return {"rank": self.rank, "group": spec.name, "group_rank": rank}

    def destroy_weights_update_group(self) -> dict[str, Any]:
        """Leave the group (nothing to do without one)."""
        had = self.group is not None or self.group_name != ""
        self.group, self.group_name, self.group_rank = None, "", -1
        if had:
            self.counters["groups_destroyed"] += 1
        return {"rank": self.rank, "destroyed": had}

    def update_weights_from_distributed(self, req: UpdateFromDistributed) -> dict[str, Any]:
        """Receive every tensor by broadcast, then swap them in at once if the checksum
        matches; on any failure the old weights stay (see the module docstring)."""
        if self.group is None:
            raise NoUpdateGroup(f"rank {self.rank} has no weight-update group")
        if not req.timeout > 0:
            raise ValueError("the broadcast timeout must be > 0")
        self._check_layout({m.name: (tuple(m.shape), m.dtype) for m in req.tensors})
        live = self.model.state_dict()
        crash = self.faults.pop("crash_mid_broadcast", None)
        opts = broadcast_options(req.timeout)
        staging: dict[str, torch.Tensor] = {}
        t0 = time.perf_counter()
        try:
            for i, meta in enumerate(req.tensors):
                if crash is not None and i == crash.after:
                    os._exit(9)
                t = torch.empty(meta.shape, dtype=live[meta.name].dtype)
                self._receive(t, opts)
                staging[meta.name] = t
                report_progress((i + 1) / len(req.tensors), meta.name)
        except Exception as exc:
            self.counters["transfer_failures"] += 1
            self.destroy_weights_update_group()
            raise WeightTransferFailed(
                f"rank {self.rank}: broadcast of version {req.version} failed after "
                f"{len(staging)}/{len(req.tensors)} tensors ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); old weights kept, "
                f"group destroyed") from None
        t1 = time.perf_counter()
        digest = checksum(staging)
        if digest != req.checksum:
            self.counters["refused"] += 1
            raise WeightsRefused(f"rank {self.rank}: checksum {digest[:12]} of version "
                                 f"{req.version} != declared {req.checksum[:12]}; old weights kept")
        t2 = time.perf_counter()
        self._swap(req.version, digest, staging)
        self.last_update = {"receive_s": t1 - t0, "verify_s": t2 - t1,
                            "swap_s": time.perf_counter() - t2}
        return {"rank": self.rank, "version": self.version, "checksum": self.checksum}

    def _receive(self, t: torch.Tensor, opts: Any) -> None:
        """One broadcast into ``t``, waited for in slices; aborted (:func:`step_aborted`),
        it is left to a thread that releases the group once it ended, and this raises.
        No reference to the work or the group outlives the call (an exception's
        traceback keeps its frames: a group kept alive keeps its connections open,
        and the other members' collectives waiting on them)."""
        work = self.group.broadcast([t], opts)
        try:
            done = threading.Event()
            work.get_future().add_done_callback(lambda _: done.set())
            # the future wakes this at once; is_completed() in case it never completes
            while not done.wait(ABORT_CHECK_EVERY) and not work.is_completed():
                if step_aborted():
                    self.counters["transfers_aborted"] += 1
                    threading.Thread(target=_release_when_done, args=(self.group, work),
                                     daemon=True,
                                     name=f"ctlwire-release-{self.group_name}").start()
                    self.group = None
                    raise BroadcastAborted("aborted by the operation's controller (a member "
                                           "of the group was lost)")
            work.wait()  # the collective's own error, if it failed
        finally:
            del work

    def update_weights_from_disk(self, req: UpdateFromDisk) -> dict[str, Any]:
        """Load a :func:`save_weights` file; swap only if its checksum is ``req.checksum``."""
        try:
            blob = torch.load(req.path, map_location="cpu", weights_only=True)
            state = blob["state"]
            if not isinstance(state, dict):
                raise TypeError("no state dict")
        except Exception as exc:
            self.counters["refused"] += 1
            raise WeightsRefused(f"rank {self.rank}: cannot read {req.path}: "
                                 f"{type(exc).__name__}; old weights kept") from None
        try:
            self._check_layout({k: (tuple(v.shape), str(v.dtype)) for k, v in state.items()})
        except WeightsRefused:
            self.counters["refused"] += 1
            raise
        digest = checksum(state)
        if digest != req.checksum:
            self.counters["refused"] += 1
            raise WeightsRefused(f"rank {self.rank}: checksum {digest[:12]} of {req.path} != "
                                 f"declared {req.checksum[:12]}; old weights kept")
        self._swap(req.version, digest, state)
        return {"rank": self.rank, "version": self.version, "checksum": self.checksum}

    def rollback_weights(self, to: WeightsRef) -> dict[str, Any]:
        """Serve ``to`` again: nothing to do when it is live, else the kept previous weights."""
        if (self.version, self.checksum) != (to.version, to.checksum):
            prev = self._previous
            if prev is None or (prev[0], prev[1]) != (to.version, to.checksum):
                raise WeightsRefused(f"rank {self.rank}: version {to.version} is not kept")
            self.model.load_state_dict(prev[2], strict=True, assign=True)
            self.version, self.checksum = to.version, to.checksum
            self._previous = None
            self.counters["rollbacks"] += 1
        return {"rank": self.rank, "version": self.version, "checksum": self.checksum}

    def check_weights(self, expected: WeightsRef) -> dict[str, Any]:
        """A post-condition: raises unless ``expected`` is the version served here."""
        if (self.version, self.checksum) != (expected.version, expected.checksum):
            raise WeightsRefused(f"rank {self.rank} serves version {self.version} "
                                 f"({self.checksum[:12]}), not {expected.version} "
                                 f"({expected.checksum[:12]})")
        return {"rank": self.rank, "version": self.version, "checksum": self.checksum}

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, recording how long each call took in :attr:`handler_seconds`, then
        publishing the status snapshot."""
        @functools.wraps(fn)
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.handler_seconds[fn.__name__] = time.perf_counter() - start
                self.publish()
        return run

    def published(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, publishing the status snapshot after each call."""
        @functools.wraps(fn)
        def run(*args: Any) -> Any:
            try:
                return fn(*args)
            finally:
                self.publish()
        return run

    def arm_fault(self, fault: TorchFault) -> None:
        if fault.kind not in ("crash_mid_broadcast", "hold_gil"):
            raise ValueError(f"unknown fault {fault.kind!r}")
        self.faults[fault.kind] = fault


STEP_METHODS = ("pause", "resume", "init_weights_update_group", "update_weights_from_distributed",
                "update_weights_from_disk", "rollback_weights", "check_weights",
                "destroy_weights_update_group")


def register(ep: EngineEndpoint) -> Callable[[], bool]:
    """Register a :class:`TorchEngine`'s methods and operation ledger on ``ep``; its step.
    ``CTLWIRE_TORCH_CONFIG`` (JSON of :class:`DecoderConfig` fields) sizes the model."""
    torch.set_num_threads(int(os.environ.get("CTLWIRE_TORCH_THREADS", "1")))
    raw = os.environ.get("CTLWIRE_TORCH_CONFIG")
    config = msgspec.json.decode(raw, type=DecoderConfig) if raw else DecoderConfig()
    engine = TorchEngine(ep.rank, config)
    handlers = {name: engine.timed(getattr(engine, name)) for name in STEP_METHODS}
    OperationLedger(handlers).install(ep)
    for name, fn in handlers.items():
        ep.register(name, fn)
    ep.register("get_server_info", engine.get_server_info, read_only=True)
    for fn in (engine.submit, engine.sequences, engine.generate, engine.arm_fault):
        ep.register(fn.__name__, engine.published(fn))
    return engine.step
