"""Printing rich tables whole, on a terminal or into a file.

rich lays a table out for the console's width. On a terminal that is the terminal's; when the
output is not a terminal (piped to a file or a pager, captured by CI) rich assumes 80 columns, or
``$COLUMNS``, and shrinks a wider table to fit: cells become ``-0.00…`` and headers ``verif…``,
and the figures are lost from the log. :func:`print_whole` keeps rich's behaviour on a terminal
and otherwise gives the console the table's own width, so every cell is printed in full.
"""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

__all__ = ["print_whole"]

#: Wider than any table we print: the width a table is measured in before it is laid out.
_UNBOUNDED = 100_000


def print_whole(table: Table, file: IO[str] | None = None) -> None:
    """Print ``table`` to ``file`` (default: stdout) with no cell cut or wrapped when ``file`` is
    not a terminal; on a terminal, as rich prints it (fitted to the terminal's width).

    Args:
        table: the rich table.
        file: a text stream; ``None`` is ``sys.stdout`` at the time of the call.
    """
    console = Console(file=file)
    if not console.is_terminal:
        natural = Measurement.get(console, console.options.update(max_width=_UNBOUNDED), table).maximum
        console = Console(file=file, width=max(console.width, natural))
    console.print(table)
