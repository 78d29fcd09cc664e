"""Safety of ``ipc://`` paths given by the caller: one rule for every transport.

An ipc socket's only protection is the file system. Guarantees:

* **Unsafe paths are refused** (:class:`IpcPathUnsafe`): the directory that
  holds the socket file must be owned by this user (or root) and writable by no
  one else. In a group- or world-writable directory (``/tmp`` itself) another
  user can create the name first, or replace our socket with theirs. **Every
  directory above it** must be owned by this user or root and not writable by
  others unless sticky (like ssh's ``StrictModes``): in a directory another user
  can write, they could rename our private directory away and put theirs in its
  place, and libzmq's reconnect would reach their socket without any check of
  ours. With the whole path safe, no other user can change where it leads, so
  the check made before the first bind or connect holds for every reconnect.
  Links on the way must be ours or root's, and the resolved path is checked
  too. When the directory does not exist yet (a dialer that starts before the
  binder), its nearest existing ancestor must be writable by no one else, so
  no other user can create it in between.
* **Nothing but a stale socket is removed.** libzmq unlinks whatever is at the
  path before it binds; :func:`prepare_ipc_bind` refuses a path that holds
  anything but a socket file of ours, so a regular file, a directory or a
  symbolic link is never deleted.
* **Links are never followed** when the socket file is made ``0600`` after bind
  (:func:`secure_ipc_file`): the file is opened with ``O_PATH | O_NOFOLLOW``,
  checked to be a socket owned by us, and changed through that descriptor.
* Abstract names (``ipc://@name``, Linux) have no file and no permissions: any
  local process can connect. The transports refuse them unless
  ``allow_abstract_ipc=True`` (:func:`~ctlwire.transports.zmq_config.check_address`),
  and then allow msgpack only, never pickle
  (see :mod:`ctlwire.transports.channel_security`).
"""

from __future__ import annotations

import contextlib
import os
import stat

from ctlwire.transports.errors import TransportError

__all__ = [
    "IpcPathUnsafe",
    "check_ipc_connect",
    "directory_problem",
    "ipc_path",
    "is_abstract",
    "prepare_ipc_bind",
    "secure_ipc_file",
]

#: Mode bits that must be clear on an ipc socket's directory.
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
_OTHERS_ANY = stat.S_IRWXG | stat.S_IRWXO


class IpcPathUnsafe(TransportError, ValueError):
    """An ipc path whose directory or existing file another user could control."""


def ipc_path(address: str) -> str | None:
    """The file of an ``ipc://`` address (``@name`` for an abstract one), else None."""
    return address[len("ipc://"):] if address.startswith("ipc://") else None


def is_abstract(path: str) -> bool:
    return path.startswith("@")


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def directory_problem(path: str, *, owner_only: bool = False) -> str | None:
    """Why the directory holding ``path`` is not safe for a socket file, or None.

    Safe: the directory is owned by this user or root and writable by no one else
    (``owner_only``: no group or other permission at all); and so is every
    directory above it, except that an ancestor another user can write is
    accepted when it is sticky (``/tmp``): there, others cannot rename or remove
    what they do not own. Checked on the path as given (a symbolic link on the
    way must belong to this user or root) and on the path it resolves to. A
    missing directory is judged by its nearest existing ancestor, which no other
    user may be able to write to (sticky or not: they could create it first).
    """
    directory = os.path.dirname(os.path.abspath(path))
    probe = directory
    while True:
        try:
            st = os.stat(probe)
            break
        except FileNotFoundError:
            parent = os.path.dirname(probe)
            if parent == probe:
                return f"no existing ancestor of {directory}"
            probe = parent
        except OSError as exc:
            return f"{probe} cannot be checked ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{probe} is not a directory"
    if not _trusted_owner(st.st_uid):
        return f"{probe} belongs to uid {st.st_uid}, not to this user"
    mode = stat.S_IMODE(st.st_mode)
    if probe != directory:
        if mode & _OTHERS_WRITE:
            return (f"{directory} does not exist and {probe} (mode {mode:o}) is writable by "
                    "other users, who could create it first")
        if owner_only:
            return f"{directory} does not exist yet: its permissions cannot be checked"
    elif mode & (_OTHERS_ANY if owner_only else _OTHERS_WRITE):
        need = "0700" if owner_only else "not group- or world-writable"
        return f"{directory} has mode {mode:o}: it must be {need}"
    return _ancestors_problem(probe)


def _ancestors_problem(directory: str) -> str | None:
    """Why a directory above ``directory`` (an existing one, checked itself) lets
    another user replace what lies below it, or None: on the path as given and on
    the path it resolves to."""
    seen: set[str] = set()
    for start in (directory, os.path.realpath(directory)):
        child = start
        while True:
            parent = os.path.dirname(child)
            if parent == child:
                break
            # the entry ``child``: a link in it is followed on every connect
            try:
                lst = os.lstat(child)
            except OSError as exc:
                return f"{child} cannot be checked ({exc.strerror})"
            if stat.S_ISLNK(lst.st_mode) and not _trusted_owner(lst.st_uid):
                return f"{child} is a symbolic link of uid {lst.st_uid}"
            if parent not in seen:
                seen.add(parent)
                try:
                    st = os.stat(parent)
                except OSError as exc:
                    return f"{parent} cannot be checked ({exc.strerror})"
                if not _trusted_owner(st.st_uid):
                    return (f"{parent} belongs to uid {st.st_uid}, who could replace "
                            f"{child} in it")
                mode = stat.S_IMODE(st.st_mode)
                if mode & _OTHERS_WRITE and not mode & stat.S_ISVTX:
                    return (f"{parent} (mode {mode:o}) is writable by other users and not "
                            f"sticky: they could replace {child} in it")
            child = parent
    return None


def _refuse(address: str, why: str) -> IpcPathUnsafe:
    return IpcPathUnsafe(
        f"refusing ipc address {address}: {why}; use a directory that only this user can "
        "write to (e.g. a private 0700 directory), or the default private address")


def prepare_ipc_bind(address: str) -> None:
    """Before binding ``address``: refuse an unsafe directory, or a path that holds
    anything but a socket file of ours (libzmq would delete it). No-op for non-ipc
    and abstract addresses."""
    path = ipc_path(address)
    if path is None or is_abstract(path):
        return
    why = directory_problem(path)
    if why is not None:
        raise _refuse(address, why)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a socket"
        raise _refuse(address, f"{path} exists and is {kind} (it would be deleted)")
    if not _trusted_owner(st.st_uid):
        raise _refuse(address, f"{path} is a socket of uid {st.st_uid}")


def check_ipc_connect(address: str) -> None:
    """Before dialing ``address``: refuse a socket file in an unsafe directory (another
    user could stand in for the peer). No-op for non-ipc and abstract addresses."""
    path = ipc_path(address)
    if path is None or is_abstract(path):
        return
    why = directory_problem(path)
    if why is not None:
        raise _refuse(address, why)


def secure_ipc_file(address: str) -> None:
    """Make a just-bound ipc socket file owner-only (``0600``) without following a link.

    Only a socket owned by this user is changed; anything else at the path (a link
    planted in a race) is left alone. Never raises for a missing file.
    """
    path = ipc_path(address)
    if path is None or is_abstract(path):
        return
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # gone, or a symbolic link (ELOOP): nothing of ours to change
    try:
        st = os.fstat(fd)
        if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid():
            with contextlib.suppress(OSError):
                # fchmod() refuses O_PATH descriptors; /proc resolves to this very inode
                os.chmod(f"/proc/self/fd/{fd}", 0o600)
    finally:
        os.close(fd)
