"""The ``ctlwire`` command line: ``diagrams``, ``demo``, ``bench``, ``keys``.

Every failure the user can fix (a bad argument, a folder that cannot be
created, a missing optional dependency) ends in one line on stderr naming the
command, and exit code 2; nothing the command line does ends in a traceback
for such input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ctlwire.app.arguments import (
    ArgumentParser,
    UsageError,
    check_new_dir,
    ensure_dir,
    ensure_parent,
    positive_int,
)

__all__ = ["build_parser", "main"]

DESCRIPTION = """\
ctlwire: the control plane between an inference API server and its engine
processes (pause, update_weights, resume, ... sent to one rank or fanned out).

Run 'ctlwire COMMAND --help' for a command's options.
"""


def _default_diagrams_dir() -> Path:
    """``diagrams/`` of the source checkout when run from one, else ``./diagrams``."""
    here = Path(__file__).resolve().parents[1]
    if (here / "pyproject.toml").exists() and (here / "states").is_dir():
        return here / "diagrams"
    return Path.cwd() / "diagrams"


def _cmd_diagrams(args: argparse.Namespace) -> int:
    from ctlwire.app.diagram_files import write_diagrams
    from ctlwire.states.diagram import DiagramUnavailable

    out = Path(args.out) if args.out else _default_diagrams_dir()
    check_new_dir(out)
    try:
        written = write_diagrams(out, args.format)
    except DiagramUnavailable as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write into {out}: {exc.strerror or exc}") from None
    for path in written:
        print(path)
    return 0


def _membership_demo(args: argparse.Namespace) -> int:
    """``demo --membership etcd``: needs the etcd binary and httpx; its own scenario."""
    import importlib.util
    import shutil

    given = [flag for flag, on in (("--torch", args.torch), ("--connect", args.connect),
                                   ("--transport tcp", args.transport == "tcp"),
                                   ("--kill-one", args.kill_one), ("--fault", args.fault),
                                   ("--json", args.json)) if on]
    if given:
        raise UsageError(f"--membership etcd runs its own scenario; {', '.join(given)} "
                         "does not apply to it")
    if args.cycles < 3 or args.engines < 2:
        raise UsageError("--membership etcd needs --cycles 3 or more and --engines 2 or "
                         "more (a rank joins, then one leaves)")
    if shutil.which("etcd") is None:
        raise UsageError("--membership etcd needs the etcd binary on PATH "
                         "(Debian: apt-get install etcd-server)")
    if importlib.util.find_spec("httpx") is None:
        raise UsageError("--membership etcd needs httpx: pip install 'ctlwire[etcd]'")
    if args.backend == "trio" and importlib.util.find_spec("trio") is None:
        raise UsageError("--backend trio needs trio installed: pip install trio")
    from ctlwire.app import membership_demo

    return membership_demo.main(membership_demo.MembershipDemoConfig(
        engines=args.engines, cycles=args.cycles, backend=args.backend, ttl=args.etcd_ttl))


def _cmd_demo(args: argparse.Namespace) -> int:
    import importlib.util

    if args.membership == "etcd":
        return _membership_demo(args)
    if args.torch:
        try:
            from ctlwire.app import torch_demo
        except ImportError as exc:
            raise UsageError(f"--torch needs the torch extra (pip install 'ctlwire[torch]'): "
                             f"{exc}") from None
        return torch_demo.demo(args.engines, args.cycles, args.model_width, args.model_layers,
                               args.backend)
    from ctlwire.app import demo

    if args.backend == "trio" and importlib.util.find_spec("trio") is None:
        raise UsageError("--backend trio needs trio installed: pip install trio")
    ensure_parent(args.json)
    _check_connect(args.connect, args.allow_insecure_tcp)
    return demo.main(demo.from_args(args), json_path=args.json)


def _check_connect(addresses: Sequence[str], allow_insecure_tcp: bool) -> None:
    """``demo --connect``: each address names a transport the demo speaks and, for
    ipc, a socket an engine has bound (checked at once: the demo would otherwise
    wait for engines that cannot answer)."""
    for address in addresses:
        scheme, _, rest = address.partition("://")
        if scheme == "tcp":
            if not allow_insecure_tcp:
                raise UsageError(f"--connect {address}: the demo speaks tcp without CURVE; "
                                 "pass --allow-insecure-tcp to allow it (any process that "
                                 "reaches the port could speak for a rank)")
        elif scheme == "ipc":
            path = Path(rest)
            if not path.parent.is_dir():
                raise UsageError(f"--connect {address}: the folder {path.parent} does not "
                                 "exist (is the path the one the engine binds?)")
            if not path.is_socket():
                raise UsageError(f"--connect {address}: no engine socket at {path} (start "
                                 "the engine that binds it first)")
        else:
            raise UsageError(f"--connect {address}: expected an ipc:// or tcp:// address")


def _cmd_keys(args: argparse.Namespace) -> int:
    from ctlwire.transports.curve import write_keypair

    existing = [p for name in args.names
                for p in (Path(args.dir) / f"{name}.key", Path(args.dir) / f"{name}.key_secret")
                if p.exists()]
    if existing and not args.force:
        # a key pair in use (allow-lists name its public key) is never replaced silently
        raise UsageError("refusing to overwrite existing key files (pass --force to "
                         f"replace them): {', '.join(map(str, existing))}")
    ensure_dir(Path(args.dir))
    for name in args.names:
        try:
            public, secret = write_keypair(args.dir, name)
        except OSError as exc:
            raise UsageError(f"cannot write the key pair {name!r} into {args.dir}: "
                             f"{exc.strerror or exc}") from None
        print(f"{public}\n{secret}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.runs != 1 and (args.reliability or args.soak):
        raise UsageError("--runs repeats the ratio bench; --reliability and --soak run once")
    ensure_parent(args.json)
    if args.reliability:
        from ctlwire.benchmarks import reliability

        return reliability.main(quick=args.quick, json_path=args.json)
    if args.soak:
        from ctlwire.benchmarks import soak

        return soak.main(quick=args.quick, json_path=args.json)
    from ctlwire.benchmarks.report import print_table
    from ctlwire.benchmarks.runner import run_bench
    from ctlwire.benchmarks.series import Series

    series = Series()
    for i in range(args.runs):
        try:
            report = run_bench(quick=args.quick, only=args.only)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.runs > 1:
            print(f"\n=== run {i + 1} of {args.runs}", flush=True)
        print_table(report)
        series.add(report)
    if args.runs > 1:
        print("\n" + series.table(), flush=True)
    if args.json:
        (series if args.runs > 1 else series.reports[0]).write_json(args.json)
        print(f"JSON written to {args.json}")
    return 0


#: the groups ``ctlwire bench --only`` takes (``ctlwire.benchmarks.runner.GROUPS``: the
#: benchmarks are not imported to print the help)
BENCH_GROUPS = ("latency", "floor", "throughput", "fanout", "fanout_pipeline",
                "fanout_profile", "trio", "live", "memory", "state_table", "scale",
                "multi_client", "detect256", "idle_cpu", "weight_sync", "poll_status",
                "engine_calls", "cpu", "import_time")


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, read only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0,
                         help="show the installed version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from ctlwire.kernel._version import __version__

        print(f"ctlwire {__version__}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="ctlwire", description=DESCRIPTION,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("diagrams", help="write the state diagram of every machine",
                       description="Write one diagram per state machine (and, for mermaid, "
                       "a README.md embedding them all) into a folder, created if missing "
                       "(in an existing folder).")
    p.add_argument("--out", metavar="DIR",
                   help="folder to write into (default: ./diagrams, or the diagrams/ folder "
                        "of the source checkout ctlwire runs from)")
    p.add_argument("--format", choices=["mermaid", "dot", "svg"], default="mermaid",
                   help="mermaid (default; no extra needed), dot or svg (need graphviz: "
                   "pip install 'ctlwire[diagrams]')")
    p.set_defaults(func=_cmd_diagrams, command_parser=p)

    p = sub.add_parser("demo", help="the RL weight-update cycle against real engine processes",
                       description="Start N engine processes over real ZeroMQ sockets and run "
                       "K pause -> update_weights -> resume cycles, each one coordinated "
                       "operation, while concurrent callers query every engine. Prints a "
                       "summary and exits 1 unless every invariant held.")
    from ctlwire.app.demo import add_arguments

    add_arguments(p)
    p.add_argument("--torch", action="store_true",
                   help="engines serving a real torch model, weights moved by gloo broadcast "
                        "(the torch extra; --engines and --cycles apply)")
    p.add_argument("--model-width", type=positive_int, default=256,
                   help="--torch: model width (256 with 2 layers: ~1.7M parameters)")
    p.add_argument("--model-layers", type=positive_int, default=2,
                   help="--torch: transformer blocks")
    p.add_argument("--membership", choices=["static", "etcd"], default="static",
                   help="static (default): a fixed set of ranks; etcd: start a local etcd, "
                        "engines register in it, and a rank joins and one leaves while the "
                        "cycles run (needs the etcd binary and httpx: the etcd extra)")
    p.add_argument("--etcd-ttl", type=positive_int, default=5, metavar="SECONDS",
                   help="--membership etcd: the engines' lease TTL (default 5)")
    p.set_defaults(func=_cmd_demo, command_parser=p)

    p = sub.add_parser("keys", help="generate CURVE key pairs for tcp across hosts",
                       description="CURVE key pairs (z85 certificate files) for tcp:// "
                       "transports across hosts.")
    keys = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    g = keys.add_parser("generate", help="write NAME.key and NAME.key_secret into DIR",
                        description="Write NAME.key (public) and NAME.key_secret (secret, "
                        "mode 0600) into DIR, created if missing (in an existing folder). "
                        "Refuses to overwrite "
                        "existing key files without --force.")
    g.add_argument("dir", metavar="DIR")
    g.add_argument("names", nargs="*", default=["server", "client"], metavar="NAME",
                   help="key pair names (default: server client)")
    g.add_argument("--force", action="store_true", help="replace existing key pairs")
    g.set_defaults(func=_cmd_keys, command_parser=g)

    p = sub.add_parser("bench", help="measure ctlwire against baselines, side by side",
                       description="Measure ctlwire against the baselines a user would "
                       "otherwise write, in one run, and print the ratios and targets.")
    p.add_argument("--quick", action="store_true", help="a reduced run (under 30 s)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.add_argument("--only", nargs="+", metavar="GROUP",
                   help="run only these groups: " + " ".join(BENCH_GROUPS))
    p.add_argument("--runs", type=positive_int, default=1, metavar="N",
                   help="N whole runs one after the other, then each row's ratios, their "
                   "median against the target and the runs it passed in")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--reliability", action="store_true",
                      help="the fault matrix instead: outcomes, lost, leaked, detection times")
    mode.add_argument("--soak", action="store_true",
                      help="the soak (100,000 calls with faults) and the 10,000 in-flight load run")
    p.set_defaults(func=_cmd_bench, command_parser=p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (argument errors exit with 2)."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # said by the command's own parser: "ctlwire demo: error: ..."
        args.command_parser.error(f"unrecognized arguments: {' '.join(extras)}")
    prog = f"ctlwire {args.command}"
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
