"""``print_whole``: a rich table printed into a file or a pipe keeps every cell whole; on a
terminal rich still fits it to the terminal's width."""

from __future__ import annotations

import io
import re

from rich.table import Table

from env_server.tables import print_whole

CELLS = ["-0.00123", "0.0789", "0.646", "-0.000512", "0.21", "0.563", "0.438", "12"]
HEADERS = ["grpo", "sdpo", "replay", "total", "r solver", "r verifier", "err sites", "pairs"]


def _wide_table() -> Table:
    """The demo's training table as it looked when cut: nine right-aligned columns, 93 wide."""
    table = Table(title="training: 80 steps (loss channels, per-role rewards, error-site rate, DPO pairs)")
    table.add_column("step", justify="right")
    for name in HEADERS:
        table.add_column(name, justify="right")
    table.add_row("80", *CELLS)
    return table


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_table_wider_than_80_columns_is_printed_whole_into_a_file(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # rich's width for a file: $COLUMNS, else 80
    out = io.StringIO()
    print_whole(_wide_table(), out)
    text = out.getvalue()
    assert "…" not in text
    assert all(cell in text for cell in CELLS) and all(name in text for name in HEADERS)
    assert max(len(line) for line in text.splitlines()) > 80


def test_a_narrow_columns_setting_does_not_cut_a_table_in_a_file(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    out = io.StringIO()
    print_whole(_wide_table(), out)
    assert "…" not in out.getvalue() and "-0.000512" in out.getvalue()


def test_on_a_terminal_rich_fits_the_table_to_the_terminal(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = _Terminal()
    print_whole(_wide_table(), out)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert max(len(_plain(line)) for line in lines) <= 80
    assert "…" in out.getvalue()  # rich's own fitting: what a terminal of 80 columns shows


def _plain(line: str) -> str:
    """The line without ANSI escape sequences (a terminal console styles its output)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", line)
