"""The ``ctlwire`` command line: ``diagrams``, ``demo``, ``bench``, ``keys``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _default_diagrams_dir() -> Path:
    """``diagrams/`` of the source checkout when run from one, else ``./diagrams``."""
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").exists() and (here / "states").is_dir():
        return here / "diagrams"
    return Path.cwd() / "diagrams"


def _cmd_diagrams(args: argparse.Namespace) -> int:
    from ctlwire.kernel.diagram_files import write_diagrams
    from ctlwire.states.diagram import DiagramUnavailable

    out = Path(args.out) if args.out else _default_diagrams_dir()
    try:
        written = write_diagrams(out, args.format)
    except DiagramUnavailable as exc:
        print(f"ctlwire diagrams: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctlwire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("diagrams", help="write the state diagrams of every machine")
    p.add_argument("--out", help="folder to write into (default: the checkout's diagrams/)")
    p.add_argument("--format", choices=["mermaid", "dot", "svg"], default="mermaid")
    p.set_defaults(func=_cmd_diagrams)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
