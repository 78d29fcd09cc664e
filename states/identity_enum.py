"""The enum base of every state and event: hashed by identity.

``Enum.__hash__`` is a Python-level function (it hashes the member's name);
states and events are dict keys on every transition of every request, so the
machines' enums use the C-level identity hash instead. Enum members are
singletons compared by identity, so this is consistent with equality.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["IdentityEnum"]


class IdentityEnum(Enum):
    """An :class:`~enum.Enum` whose members hash by identity (C speed)."""

    __hash__ = object.__hash__
