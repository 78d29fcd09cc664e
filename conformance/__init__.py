"""A conformance harness for the wire protocol (``docs/protocol.md``): it plays one side
over real sockets against any implementation of the other and prints a pass/fail
line per check.

::

    # check an engine: bind ADDR (the client's side), start the engine, run the checks
    python -m ctlwire.conformance engine \\
        --spawn "node cli.js engine --connect {address} --rank {rank}"
    # check a client: play engines 0 and 1 (protocol 1.0) and 2 (announcing 2.0) at the
    # address the client program binds, run its conformance script, check both sides
    python -m ctlwire.conformance client \\
        --spawn "node cli.js conformance-client --bind {address}"

Without ``--spawn`` the harness uses ``--address`` and waits for the other side
(started by hand). Each check prints ``PASS``, ``FAIL``, or ``SKIP`` (a rule of the
serving model the engine does not follow, see
:mod:`~ctlwire.conformance.serving_check`). Exit status 0 when no check
failed, 1 otherwise.

The harness uses raw pyzmq sockets and this package's envelopes and codec only
(NULL security): it checks the bytes and the behaviour the spec describes, not
another copy of the Python kernel. The methods an engine under test must serve,
and the script a client under test must run, are the spec's "Conformance harness"
section; each check is named after the spec section it tests
(:data:`~ctlwire.conformance.engine_check.ENGINE_CASES`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ctlwire.conformance.client_check import CLIENT_CASES, CheckClient, read_outcomes
from ctlwire.conformance.engine_check import ENGINE_CASES, CheckEngine
from ctlwire.conformance.report import Check, Report

__all__ = ["CLIENT_CASES", "ENGINE_CASES", "Check", "CheckClient", "CheckEngine",
           "check_client", "check_engine", "main"]


def private_address(name: str) -> str:
    """An ipc address in a fresh 0700 directory."""
    return f"ipc://{tempfile.mkdtemp(prefix='ctlwire-conf-')}/{name}"


@contextmanager
def spawned(command: str | None, **values: Any) -> Iterator[subprocess.Popen[bytes] | None]:
    """``command`` (``{address}`` and the like filled in) as a process, ended on exit."""
    if not command:
        yield None
        return
    proc = subprocess.Popen(shlex.split(command.format(**values)), stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


@contextmanager
def _address(address: str | None, name: str) -> Iterator[str]:
    """``address``, or a private ipc address removed afterwards."""
    if address:
        yield address
        return
    private = private_address(name)
    try:
        yield private
    finally:
        shutil.rmtree(os.path.dirname(private[len("ipc://"):]), ignore_errors=True)


def check_engine(address: str | None, rank: int, spawn: str | None, timeout: float) -> Report:
    """Every engine check against the engine of ``rank`` (``spawn``: its command), the
    harness bound at ``address`` (None: a private ipc address)."""
    report = Report()
    with _address(address, "engine") as where:
        harness = CheckEngine(where, rank, timeout=timeout)
        try:
            with spawned(spawn, address=where, rank=rank):
                harness.run(report)
        finally:
            harness.close()
    return report


def check_client(address: str | None, spawn: str, timeout: float) -> Report:
    """Every client check against the conformance program ``spawn`` (binding ``address``,
    None: a private ipc address), its script bounded by ``timeout`` seconds."""
    report = Report()
    with _address(address, "client") as where, spawned(spawn, address=where) as proc:
        assert proc is not None
        with CheckClient(where) as engines:
            outcomes = read_outcomes(proc, timeout)
            report.add("conformance-harness/client-script-finished", "done" in outcomes,
                       f"{len(outcomes)} steps reported")
            engines.check(outcomes, report)
    report.missing(CLIENT_CASES)
    return report


def main(argv: list[str] | None = None, *, out: Callable[[str], Any] = sys.stdout.write) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ctlwire.conformance",
        description="Check an implementation of the ctlwire wire protocol over real sockets.")
    sub = parser.add_subparsers(dest="role", required=True)
    eng = sub.add_parser("engine", help="play the client; check an engine")
    eng.add_argument("--address", help="where to bind (default: a private ipc address)")
    eng.add_argument("--rank", type=int, default=0)
    eng.add_argument("--spawn", help="the engine's command ({address}, {rank} filled in)")
    eng.add_argument("--timeout", type=float, default=10.0, help="seconds per reply")
    cli = sub.add_parser("client", help="play engines 0, 1 and 2; check a client")
    cli.add_argument("--address", help="where the client binds (default: a private ipc "
                                       "address)")
    cli.add_argument("--spawn", required=True,
                     help="the client's conformance program ({address} filled in)")
    cli.add_argument("--timeout", type=float, default=60.0, help="seconds for its script")
    args = parser.parse_args(argv)
    out(f"ctlwire conformance: checking a{'n' if args.role == 'engine' else ''} "
        f"{args.role}\n")
    if args.role == "engine":
        report = check_engine(args.address, args.rank, args.spawn, args.timeout)
    else:
        report = check_client(args.address, args.spawn, args.timeout)
    out(report.summary() + "\n")
    return 0 if report.passed else 1

