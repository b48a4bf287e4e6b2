"""The console that `bench` and `tune` print their results to."""

from __future__ import annotations

from typing import IO

from rich.console import Console

# Piped or redirected, rich fits its output into 80 columns: it cuts table cells
# ("curre…") and breaks lines. A file or a pipe has no width, so none is imposed.
PIPED_WIDTH = 10_000


def stdout_console(file: IO[str] | None = None) -> Console:
    """A console for results: the terminal's width, or `PIPED_WIDTH` when not a terminal."""
    console = Console(file=file)
    return console if console.is_terminal else Console(file=file, width=PIPED_WIDTH)
