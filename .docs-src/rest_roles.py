"""A griffe extension for the API reference: ctlwire's docstrings use
reStructuredText roles (``:class:`~ctlwire.kernel.ControlClient```) and double
backquotes; the reference renders Markdown. Roles become inline code with the
name a reader would write (the last part after ``~``), double backquotes
single ones, and ``::`` before an indented block a colon and a code fence."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|mod|meth|func|attr|data|exc|obj|const):`(~?)([^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")
LITERAL_BLOCK = re.compile(r"::\n\n((?:(?:    |\t)[^\n]*\n|\n)+)", re.M)


def _role(m: re.Match[str]) -> str:
    tilde, target = m.groups()
    target = target.strip()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _block(m: re.Match[str]) -> str:
    body = "\n".join(line[4:] if line.startswith("    ") else line
                     for line in m.group(1).rstrip("\n").split("\n"))
    return f":\n\n```python\n{body}\n```\n\n"


def markdown(text: str) -> str:
    """A docstring's reST roles and literals as Markdown."""
    text = LITERAL_BLOCK.sub(_block, text)
    text = ROLE.sub(_role, text)
    return LITERAL.sub(r"`\1`", text)


class RestRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
