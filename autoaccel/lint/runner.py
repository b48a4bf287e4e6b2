"""Lint many files, in parallel over all cores when there are enough of them.

Notebooks are linted as the script of their code cells (`autoaccel.notebook`); the
engine never sees a notebook, and positions are mapped back around it."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from collections.abc import Callable

from autoaccel.analysis.project import SCRIPT
from autoaccel.diff import unified_diff
from autoaccel.config import ConfigError, LintSettings, settings_for
from autoaccel.fileio import (
    MAX_SOURCE_BYTES,
    mebibytes,
    os_error_message,
    read_source,
    write_atomic,
)
from autoaccel.lint.engine import analyse
from autoaccel.lint.rule import Diagnostic
from autoaccel.notebook import CellRange, Notebook, NotebookError, is_notebook, read_notebook
from autoaccel.source import TOO_DEEP, SourceError, interruptible

PARALLEL_THRESHOLD = 4  # below this many files a process pool costs more than it saves


class Mode(Enum):
    CHECK = "check"
    FIX = "fix"  # write fixes in place
    DIFF = "diff"  # show what FIX would change, write nothing


@dataclass(frozen=True)
class Overrides:
    """Command-line settings; they win over pyproject.toml (Ruff's precedence)."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    unsafe_fixes: bool = False
    force_exclude: bool = False
    max_file_size: int = MAX_SOURCE_BYTES  # bytes of Python code; a larger file is not read
    precise: bool = False  # `--precise` (the pre-commit hooks): see `LintSettings.precise`

    def apply(self, settings: LintSettings) -> LintSettings:
        if self.precise:
            settings = settings.precise()
        select = self.select if self.select is not None else settings.select
        return replace(
            settings,
            select=select + self.extend_select,
            ignore=settings.ignore + self.ignore,
            unsafe_fixes=self.unsafe_fixes,
            force_exclude=self.force_exclude or settings.force_exclude,
        )


@dataclass
class FileResult:
    path: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    error: str | None = None  # "line:col: message" for files that cannot be read or parsed
    fixed: int = 0
    diff: str = ""
    fixed_source: str | None = None  # set for stdin in FIX mode
    # Notebooks: each finding's place in cell terms; its own line/column are then
    # positions in the `.ipynb` text (where GitHub and editors put them).
    cells: dict[Diagnostic, CellRange] | None = None
    # The files of the local modules the text imports, read with it (CHECK mode).
    imports: tuple[str, ...] = ()


def _line_and_column(line: int, column: int) -> str:
    return f"{line}:{column}"


def lint_text(
    text: str,
    display_path: str,
    settings: LintSettings,
    mode: Mode,
    describe: Callable[[int, int], str] = _line_and_column,
    script: Path | None = None,
) -> FileResult:
    """Lint (and in FIX/DIFF mode, fix) one text; nothing is written here.
    `describe` names the place of a syntax error; `script` is the file the text was
    read from (the local modules it imports are analysed with it)."""
    result = FileResult(path=display_path)
    try:
        with _cycle_collection_paused(), interruptible():
            if mode is Mode.CHECK:
                analysis = analyse(text, settings, display_path, script=script)
                result.diagnostics = analysis.diagnostics
                project = analysis.project
                if project is not None and project.name == SCRIPT:  # the modules it imports
                    result.imports = tuple(m.path for m in project.others if m.path)
                return _portable(result)
            from autoaccel.lint.fixer import fix_source  # --fix and --diff only

            outcome = fix_source(text, settings, display_path, script=script)
    except SourceError as error:
        result.error = f"{describe(error.line, error.column)}: {error.message}"
        return result
    except RecursionError:
        result.error = f"1:1: error: {TOO_DEEP}"
        return result
    except Exception as error:  # noqa: BLE001 - one file's crash must not stop the run
        # A bug in a rule or the analysis: report it like Ruff does (exit 2) and go on
        # with the other files instead of losing the whole (possibly parallel) run.
        result.error = f"1:1: internal error: {type(error).__name__}: {error}"
        return result
    result.diagnostics = outcome.remaining
    result.fixed = len(outcome.fixed)
    if outcome.source != text:
        result.fixed_source = outcome.source
        if mode is Mode.DIFF:
            result.diff = unified_diff(text, outcome.source, display_path)
    return _portable(result)


@contextmanager
def _cycle_collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while one text is analysed. The tree and the
    analysis stay alive to the end (~2 million objects for 32,000 lines), and each full
    collection on the way re-scanned them all: the time per line grew with the file.
    Reference counting still frees memory; cycles are collected after the text."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _portable(result: FileResult) -> FileResult:
    result.diagnostics = [d.without_edits() for d in result.diagnostics]
    return result


def lint_file(path: Path, overrides: Overrides, mode: Mode) -> FileResult:
    """Read, lint and (in FIX mode) atomically rewrite one file."""
    display = str(path)
    try:
        settings = overrides.apply(settings_for(path))
        if is_notebook(path):
            return _lint_notebook(path, settings, mode, overrides.max_file_size)
        source = read_source(path, overrides.max_file_size)
    except OSError as error:
        return FileResult(path=display, error=f"1:1: error: {os_error_message(error)}")
    except (UnicodeDecodeError, SyntaxError, ConfigError, NotebookError) as error:
        return FileResult(path=display, error=f"1:1: error: {error}")
    result = lint_text(source.text, display, settings, mode, script=path)
    if mode is Mode.FIX and result.fixed_source is not None:
        _write_fixes(result, path, result.fixed_source, source.encoding, source.raw)
    result.fixed_source = None
    return result


def _write_fixes(result: FileResult, path: Path, text: str, encoding: str, original: bytes) -> None:
    """Write the fixed text; a file that cannot be written is an error of its own
    (the other files of the run are still linted and fixed)."""
    try:
        write_atomic(path, text, encoding, original)
    except OSError as error:
        result.error = f"1:1: error: fixes not written: {os_error_message(error)}"
        result.fixed = 0


def _lint_notebook(path: Path, settings: LintSettings, mode: Mode, limit: int) -> FileResult:
    """Lint a notebook's code cells (at most `limit` bytes of them); fixes rewrite only
    the cells they change."""
    notebook = read_notebook(path)
    size = len(notebook.python.encode())
    if size > limit:
        error = (
            f"1:1: error: code cells larger than {mebibytes(limit)} ({mebibytes(size)}); not read"
        )
        return FileResult(path=str(path), error=error)

    def describe(line: int, column: int) -> str:
        return str(notebook.cell_range(line, column, line, column))

    result = lint_text(notebook.python, str(path), settings, mode, describe)
    if result.fixed_source is not None:
        fixed = Notebook(notebook.with_python(result.fixed_source))
        if mode is Mode.DIFF:
            before, after = notebook.render(notebook.python), fixed.render(fixed.python)
            result.diff = unified_diff(before, after, str(path))
        elif mode is Mode.FIX:
            _write_fixes(result, path, fixed.text, "utf-8", notebook.text.encode("utf-8"))
        notebook, result.fixed_source = fixed, None  # what remains is found in the fixed text
    result.cells = {}
    for index, d in enumerate(result.diagnostics):
        line, column = notebook.file_position(d.line, d.column)
        end_line, end_column = notebook.file_position(d.end_line, d.end_column)
        located = replace(d, line=line, column=column, end_line=end_line, end_column=end_column)
        result.cells[located] = notebook.cell_range(d.line, d.column, d.end_line, d.end_column)
        result.diagnostics[index] = located
    return result


def lint_files(paths: list[Path], overrides: Overrides, mode: Mode) -> list[FileResult]:
    """Results in the order of `paths` (which `discover` returns sorted)."""
    if len(paths) < PARALLEL_THRESHOLD:
        return [lint_file(path, overrides, mode) for path in paths]
    from concurrent.futures import ProcessPoolExecutor  # ~10 ms a one-file run skips
    from concurrent.futures.process import BrokenProcessPool

    workers = min(os.cpu_count() or 1, len(paths))
    results: list[FileResult] = []
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            chunk = max(1, len(paths) // (workers * 4))
            count = len(paths)
            linted = pool.map(
                lint_file, paths, [overrides] * count, [mode] * count, chunksize=chunk
            )
            for result in linted:
                results.append(result)
    except BrokenProcessPool:
        # A worker died (a crash in native code): the files not reported yet are linted
        # one process each, so that the one to blame is named and the others reported.
        results += [_lint_in_own_process(path, overrides, mode) for path in paths[len(results) :]]
    return results


def _lint_in_own_process(path: Path, overrides: Overrides, mode: Mode) -> FileResult:
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(max_workers=1) as pool:
        try:
            return pool.submit(lint_file, path, overrides, mode).result()
        except BrokenProcessPool:
            return FileResult(str(path), error="1:1: internal error: the process linting it died")
