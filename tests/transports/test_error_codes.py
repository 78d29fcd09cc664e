"""One table holds the error codes (:class:`~ctlwire.transports.error_codes.ErrorCode`).

* It agrees with the protocol's error table as the conformance harness states it
  (which a test holds to ``docs/protocol.md``): each type's code, by its name.
* No other part of the library writes a code as a number: every ``code = N`` class
  attribute and every integer handed to an ``ErrorInfo`` or to an error reply is read
  from the table (the syntax tree of ``kernel/`` and ``transports/``; the demos and the
  conformance harness's expected answers are outside the rule).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ctlwire.transports.conformance_report import CONFORMANCE_ERROR, ERROR_TABLE
from ctlwire.transports.error_codes import ErrorCode

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "transports" / "error_codes.py"
#: the demos' own handler errors, and the harness's expected answers (a spec, not a source)
OUTSIDE = ("kernel/app/", "transports/conformance")
#: calls whose integer arguments are error codes
CODE_CALLS = frozenset({"ErrorInfo", "error_reply", "_reject"})


def _constant(type_name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type_name).upper()


def test_the_table_gives_every_error_type_the_protocol_code() -> None:
    for code, type_name, _cls in ERROR_TABLE:
        if type_name == CONFORMANCE_ERROR[0]:
            continue
        assert getattr(ErrorCode, _constant(type_name)) == code, type_name


def _is_code(node: ast.AST | None) -> bool:
    """An integer literal that reads as a code (0 means none)."""
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 100


def _literal_codes(tree: ast.AST) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                targets = (stmt.targets if isinstance(stmt, ast.Assign)
                           else [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
                value = getattr(stmt, "value", None)
                if (any(isinstance(t, ast.Name) and t.id == "code" for t in targets)
                        and _is_code(value)):
                    found.append(stmt.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in CODE_CALLS and any(_is_code(a) for a in node.args):
                found.append(node.lineno)
    return found


def test_no_code_is_written_as_a_number_outside_the_table() -> None:
    offenders = []
    for folder in ("kernel", "transports"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if path == TABLE or rel.startswith(OUTSIDE):
                continue
            offenders += [f"{rel}:{line}" for line in _literal_codes(ast.parse(path.read_text()))]
    assert offenders == []


def test_the_check_finds_a_literal_code() -> None:
    source = ("class Refusal(Exception):\n    code = 409\n"
              "reply = core.error_reply(1, 'Busy', 'full', 429)\n")
    assert _literal_codes(ast.parse(source)) == [2, 3]
