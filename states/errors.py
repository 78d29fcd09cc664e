"""Errors raised by the state tables."""

from __future__ import annotations

from enum import Enum

__all__ = ["IllegalTransition"]


class IllegalTransition(Exception):
    """An event was applied to a state that has no transition for it.

    Carries the machine name, the state, the event and, when the caller knows it,
    the id of the request (or ticket, or peer) the machine belongs to.
    """

    def __init__(
        self,
        machine: str,
        state: Enum,
        event: Enum,
        request_id: object | None = None,
    ) -> None:
        self.machine = machine
        self.state = state
        self.event = event
        self.request_id = request_id
        where = "" if request_id is None else f" (id {request_id!r})"
        super().__init__(
            f"{machine}: event {event.value!r} is not allowed in state {state.name}{where}"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.machine, self.state, self.event, self.request_id))
