"""TransitionRecorder: the states each request went through, for path assertions."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ctlwire.kernel.core.request_registry import PendingRequest
from ctlwire.states import RequestEvent, RequestState

__all__ = ["TransitionRecorder"]

class TransitionRecorder:
    """Records every ControlRequest transition; pass as ``ControlClient(observer=...)``."""

    def __init__(self) -> None:
        self.paths: dict[int, list[RequestState]] = defaultdict(list)
        self.events: dict[int, list[RequestEvent]] = defaultdict(list)
        self.methods: dict[int, str] = {}

    def __call__(self, entry: PendingRequest, old: RequestState, event: RequestEvent,
                 new: RequestState) -> None:
        path = self.paths[entry.id]
        if not path:
            path.append(old)
            self.methods[entry.id] = entry.method
        path.append(new)
        self.events[entry.id].append(event)

    def path(self, request_id: int) -> list[str]:
        return [s.name for s in self.paths[request_id]]

    def ids(self, method: str | None = None) -> list[int]:
        """Request ids seen, in first-transition order (optionally one method's)."""
        return [rid for rid, m in self.methods.items() if method is None or m == method]

    def assert_path(self, request_id: int, expected: Sequence[str | RequestState]) -> None:
        want = [s.name if isinstance(s, RequestState) else s for s in expected]
        got = self.path(request_id)
        if got != want:
            raise AssertionError(f"request {request_id}: went {got}, expected {want}")

    def assert_all_cleaned(self) -> None:
        unfinished = {rid: self.path(rid) for rid, p in self.paths.items()
                      if not p or p[-1] is not RequestState.CLEANED}
        if unfinished:
            raise AssertionError(f"requests not cleaned: {unfinished}")
