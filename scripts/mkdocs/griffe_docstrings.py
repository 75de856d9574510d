"""A griffe extension for the docs site: our docstrings as griffe's Google-style parser reads them.

**Grouped names.**
The project's Google-style docstrings document related parameters and attributes together, as
``student_logits, teacher_logits: (N, V) logits``, with the names sometimes wrapped over several
lines (each ending with a comma). Google style has one name per entry, so griffe's parser (what
mkdocstrings renders the API reference with) reads the first name as the entry's name, the rest
as its type, and warns that such a "parameter" is not in the signature. This rewrites the
docstring text before it is parsed: a grouped entry becomes one entry per name, each with the
whole description. Then every name is its own row, and griffe's check that each documented
parameter exists in the signature applies to each name.

**Sphinx roles.** Docstrings name other objects as ``:class:`~a.b.C```, ``:func:`f``` (reST),
which Markdown shows as literal text. Each becomes a code span of its target (``C`` for the
``~`` form, as Sphinx shows it). Not links: a target that the site does not render (a private
helper, pydantic's ``ValidationError``) would be a broken cross-reference, which fails the
strict build.

Our own code because griffe has no option for either (its parsers take one name per entry and
read Markdown), and each rewrite is a few lines of text handling.

Used by ``mkdocs.yml`` (``plugins: mkdocstrings: handlers: python: options: extensions``) and by
the configuration reference (``scripts/mkdocs/hooks.py``), which parses the configuration models'
Attributes with the same rewrites.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

__all__ = ["OurDocstrings", "rewrite_docstring", "split_grouped_entries", "strip_sphinx_roles"]

#: Google-style section titles whose entries are ``name: description``.
SECTIONS = ("Args", "Arguments", "Parameters", "Params", "Attributes", "Keyword Args", "Keyword Arguments",
            "Other Parameters", "Other Args")
_SECTION = re.compile(r"^(\s*)(" + "|".join(SECTIONS) + r"):\s*$")
_NAME = r"\*{0,2}[A-Za-z_]\w*"
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
_GROUPED = re.compile(rf"^({_NAME}(?:\s*,\s*{_NAME})+)\s*:(.*)$")  # a, b: description
_NAMES_ONLY = re.compile(rf"^{_NAME}(?:\s*,\s*{_NAME})*\s*,\s*$")  # a, b,   (continued on the next line)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def split_grouped_entries(text: str) -> str:
    """``text`` (a docstring, dedented) with every grouped entry of its parameter and attribute
    sections split into one entry per name, each carrying the group's whole description.

    Args:
        text: the docstring as ``inspect.getdoc`` or griffe holds it.

    Returns:
        The rewritten docstring; ``text`` itself when it has no grouped entry.
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        header = _SECTION.match(line)
        if not header:
            continue
        header_indent = len(header.group(1))
        item_indent: int | None = None
        while i < len(lines):
            line = lines[i]
            if line.strip() and _indent(line) <= header_indent:
                break  # the section ended
            if not line.strip():
                out.append(line)
                i += 1
                continue
            if item_indent is None:
                item_indent = _indent(line)
            if _indent(line) != item_indent:
                out.append(line)  # a continuation line of an entry
                i += 1
                continue
            # An entry's first line, its names possibly wrapped over lines that end with a comma.
            names_text, j = line.strip(), i
            while _NAMES_ONLY.match(names_text) and j + 1 < len(lines) and _indent(lines[j + 1]) == item_indent:
                j += 1
                names_text += " " + lines[j].strip()
            grouped = _GROUPED.match(names_text)
            if not grouped:
                out.append(line)
                i += 1
                continue
            k = j + 1
            while k < len(lines) and (not lines[k].strip() or _indent(lines[k]) > item_indent):
                k += 1
            while k > j + 1 and not lines[k - 1].strip():
                k -= 1  # trailing blank lines belong to the section, not to the entry
            rest = lines[j + 1:k]
            pad = " " * item_indent
            for name in (n.strip() for n in grouped.group(1).split(",")):
                out.append(f"{pad}{name}:{grouped.group(2)}")
                out.extend(rest)
            i = k
    return "\n".join(out)


def strip_sphinx_roles(text: str) -> str:
    """``:class:`~a.b.C``` as ``` ``C`` ```, ``:func:`a.f``` as ``` ``a.f`` ``` (any Python-domain role)."""
    return _ROLE.sub(lambda m: "``" + (m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)) + "``", text)


def rewrite_docstring(text: str) -> str:
    """Both rewrites: :func:`split_grouped_entries`, then :func:`strip_sphinx_roles`."""
    return strip_sphinx_roles(split_grouped_entries(text))


class OurDocstrings(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`rewrite_docstring`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """griffe calls this for each object it loads, before any docstring is parsed."""
        if obj.docstring is not None:
            obj.docstring.value = rewrite_docstring(obj.docstring.value)
