"""Turning docstrings and comments into Markdown (pure)."""

from __future__ import annotations

import inspect
import re

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr):`~?([^`]+)`")


def rst_to_md(text: str) -> str:
    """``code`` -> `code`; :class:`~a.b.C` -> `C` (the last part of a ``~`` path, else the path)."""
    text = _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`")


def clean_docstring(doc: str) -> str:
    """A class docstring as Markdown paragraphs; ``::`` literal blocks are dropped."""
    text = inspect.cleandoc(doc)
    paragraphs = []
    for para in text.split("\n\n"):
        if para.startswith(" ") or para.strip() == "::":
            continue
        para = para.removesuffix("::").rstrip()
        paragraphs.append(rst_to_md(" ".join(line.strip() for line in para.splitlines())))
    return "\n\n".join(p for p in paragraphs if p)


def cell(text: str) -> str:
    """``text`` safe inside one Markdown table cell."""
    return rst_to_md(text).replace("|", "\\|").replace("\n", " ")
