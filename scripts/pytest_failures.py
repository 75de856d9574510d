"""Print each failed or errored test of a pytest JUnit XML report: its node id, then the first
lines of its failure (pytest's one-line message, the ``E`` lines of the traceback, and where it
was raised). The checks of ``scripts/test.sh`` run pytest in their own environments and keep only
a summary line; this is what they print when a test fails, so the failure shows where the
command's output is read.

Usage: python scripts/pytest_failures.py REPORT.xml [--lines N]
Exit status: 0 (also when nothing failed; then it prints nothing); 2 when the report cannot be read.

Standard library only: it runs under whatever Python ran the tests.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

__all__ = ["failures", "main", "node_id"]


def node_id(classname: str, name: str, root: Path) -> str:
    """pytest's node id (``tests/e2e/test_x.py::TestY::test_z``) from a JUnit ``classname``
    (``tests.e2e.test_x.TestY``) and ``name``: the longest dotted prefix that is a file under
    ``root`` is the module, the rest are classes."""
    parts = classname.split(".") if classname else []
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return "::".join([p for p in (classname, name) if p])


def _first_lines(element: ET.Element, limit: int) -> list[str]:
    """The failing statement (pytest's ``>`` line), the ``E`` lines (what was raised, with the
    values of an assertion), else pytest's message, and the ``file:line: Error`` line."""
    message = (element.get("message") or "").strip()
    lines = (element.text or "").splitlines()
    statement = [line for line in lines if line.startswith(">")][-1:]
    raised = [line for line in lines if line.startswith("E ")] or message.splitlines()
    where = [line for line in lines if line and not line.startswith((" ", "E ", "_", ">")) and ":" in line
             and line.split(":", 2)[1].isdigit()][-1:]
    out = [f"> {line[1:].strip()}" for line in statement] + raised[: max(1, limit - 2)] + where
    if not out:  # neither a statement, a message nor E lines: the report's first lines as they are
        out = [line for line in lines if line.strip()]
    return out[:limit]


def failures(report: Path, root: Path, limit: int = 15) -> list[tuple[str, str, list[str]]]:
    """``[(FAILED or ERROR, node id, first lines)]`` for each failed or errored test of ``report``.

    Raises:
        ET.ParseError: the file is not XML. OSError: it cannot be read.
    """
    found = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for tag, label in (("failure", "FAILED"), ("error", "ERROR")):
            element = case.find(tag)
            if element is not None:
                found.append((label, node_id(case.get("classname", ""), case.get("name", ""), root),
                              _first_lines(element, limit)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--lines", type=int, default=15, help="at most this many lines per test (default 15)")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the directory pytest ran in (default: here)")
    args = parser.parse_args(argv)
    try:
        found = failures(args.report, args.root, args.lines)
    except (OSError, ET.ParseError) as exc:
        print(f"pytest_failures: cannot read {args.report}: {exc}", file=sys.stderr)
        return 2
    for label, node, lines in found:
        print(f"{label} {node}")
        for line in lines:
            print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
