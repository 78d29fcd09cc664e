"""Argument types and checks shared by the ``ctlwire`` commands.

A problem with the user's input is a :class:`UsageError` (one line, exit code 2),
never a traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from ctlwire.kernel.errors import CtlwireError

__all__ = ["ArgumentParser", "UsageError", "check_new_dir", "ensure_dir", "ensure_parent",
           "non_negative_float", "positive_int"]


class UsageError(CtlwireError):
    """A problem with the command's input: reported in one line, exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``PROG: error: MESSAGE``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _existing_folder(folder: Path, what: str) -> None:
    """:class:`UsageError` unless ``folder`` is an existing folder (``what`` needs it)."""
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist (create it first)"
        raise UsageError(f"cannot {what}: {folder} {why}")


def check_new_dir(path: Path) -> None:
    """``path`` is a folder, or one that can be created in an existing folder: as
    ``mkdir`` without ``-p``, the missing folders above it are not created (a typo
    in a path creates nothing). :class:`UsageError` otherwise."""
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{path} exists and is not a folder")
        return
    _existing_folder(path.absolute().parent, f"create the folder {path}")


def ensure_dir(path: Path) -> Path:
    """``path`` as a folder, created if missing (see :func:`check_new_dir`)."""
    check_new_dir(path)
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the folder {path}: {exc.strerror or exc}") from None
    return path


def ensure_parent(path: str | None) -> None:
    """The folder a file will be written into exists (checked before any work is
    done; nothing is created)."""
    if path:
        _existing_folder(Path(path).absolute().parent, f"write {path}")
