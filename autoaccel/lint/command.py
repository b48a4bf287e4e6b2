"""`autoaccel lint`: discover files, lint them, print, and choose the exit code."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

from autoaccel.config import ConfigError, check_selectors, settings_for
from autoaccel.discovery import discover
from autoaccel.diff import use_colour
from autoaccel.fileio import MAX_SOURCE_BYTES, mebibytes, os_error_message
from autoaccel.lint.output import FORMATTERS, format_text, statistics_text, summary_text
from autoaccel.lint.output_format import OutputFormat
from autoaccel.lint.runner import FileResult, Mode, Overrides, lint_files, lint_text

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
EXIT_INTERRUPTED = 128 + 2  # SIGINT, as a shell reports it

# The on/off options of `autoaccel lint` (declared with typer in `autoaccel.cli`), by
# spelling, for `run_plain_call`; `tests/test_cli_lint.py` checks them against typer's.
PLAIN_FLAGS = {
    "--fix": "fix",
    "--diff": "diff",
    "--unsafe-fixes": "unsafe_fixes",
    "--exit-zero": "exit_zero",
    "--statistics": "statistics",
    "--quiet": "quiet",
    "-q": "quiet",
    "--force-exclude": "force_exclude",
    "--precise": "precise",
}


def run_plain_call(args: list[str]) -> int | None:
    """`autoaccel lint ARGS` when ARGS are only paths and `PLAIN_FLAGS` (how pre-commit
    calls it), without typer; the other options keep `run_lint`'s defaults, which are
    the command's. Returns None, to let typer parse, for anything else (`--help`,
    options with values, `--`)."""
    paths = []
    flags = {}
    for arg in args:
        if arg in PLAIN_FLAGS:
            flags[PLAIN_FLAGS[arg]] = True
        elif arg == "-" or not arg.startswith("-"):
            paths.append(arg)
        else:
            return None
    return run_lint(paths or ["."], **flags)


def _quiet_on_interrupt(run: Callable[..., int]) -> Callable[..., int]:
    """`run`, returning `EXIT_INTERRUPTED` on Ctrl-C instead of raising (Python would
    print a traceback; a shell's own commands print nothing)."""

    @functools.wraps(run)
    def quiet(*args: Any, **kwargs: Any) -> int:
        try:
            return run(*args, **kwargs)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED

    return quiet


@_quiet_on_interrupt
def run_lint(
    paths: list[str],
    output_format: OutputFormat = OutputFormat.text,
    select: tuple[str, ...] | None = None,
    extend_select: tuple[str, ...] = (),
    ignore: tuple[str, ...] = (),
    fix: bool = False,
    diff: bool = False,
    unsafe_fixes: bool = False,
    exit_zero: bool = False,
    statistics: bool = False,
    quiet: bool = False,
    force_exclude: bool = False,
    stdin_filename: Path | None = None,
    precise: bool = False,
    max_file_size: int = MAX_SOURCE_BYTES,
) -> int:
    """Lint `paths` and print the report; returns Ruff's exit code. `stdin_filename`
    names the text `-` reads (for messages, configuration and its local imports).
    `precise`: without `select` in pyproject.toml, only the precise rules run.
    `max_file_size`: bytes of Python code; a larger file is reported, not read."""
    overrides = Overrides(
        select, extend_select, ignore, unsafe_fixes, force_exclude, max_file_size, precise
    )
    mode = Mode.DIFF if diff else Mode.FIX if fix else Mode.CHECK
    missing = [p for p in paths if p != "-" and _missing(p)]
    unlisted: list[FileResult] = []
    try:
        for option, codes in (
            ("--select", select),
            ("--extend-select", extend_select),
            ("--ignore", ignore),
        ):
            check_selectors(codes or (), option)
        if paths == ["-"]:
            results = _lint_stdin(overrides, mode, stdin_filename)
        else:
            files, unlisted = _files(paths, missing, overrides)
            for path in files:  # a bad configuration stops the run before any file is read
                settings_for(path)
            results = lint_files(files, overrides, mode)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    missing_results = [
        FileResult(p, error="1:1: error: no such file or directory") for p in missing
    ]
    results = missing_results + unlisted + results

    for result in results:
        if result.error:
            print(f"{result.path}:{result.error}", file=sys.stderr)
    # With `--fix` on stdin, stdout carries the fixed source, so findings go to stderr.
    report = sys.stderr if paths == ["-"] and mode is Mode.FIX else sys.stdout
    if mode is Mode.DIFF:
        report.write("".join(r.diff for r in results))
    elif statistics:
        report.write(statistics_text(results))
    elif output_format is OutputFormat.text:
        report.write(format_text(results, unsafe_fixes, use_colour(report)))
    else:
        report.write(FORMATTERS[output_format](results, unsafe_fixes))
    if quiet:
        pass
    elif mode is Mode.DIFF:
        print(_would_fix_text(results), file=sys.stderr)
    elif output_format is OutputFormat.text:
        closing = summary_text(results, unsafe_fixes)
        if closing:
            print(closing, file=sys.stderr)
        if mode is Mode.CHECK and paths != ["-"]:
            given = {os.path.realpath(p) for p in paths if os.path.isfile(p)}
            named = [r for r in results if os.path.realpath(r.path) in given]
            for note in _unlinted_imports(named, results, overrides):
                print(note, file=sys.stderr)

    if any(r.error for r in results):
        return EXIT_ERROR
    if exit_zero:
        return EXIT_CLEAN
    if mode is Mode.DIFF:
        return EXIT_FINDINGS if any(r.diff for r in results) else EXIT_CLEAN
    return EXIT_FINDINGS if any(r.diagnostics for r in results) else EXIT_CLEAN


def _missing(path: str) -> bool:
    """Whether nothing is at `path`. A path that cannot be looked at (a folder on the
    way may not be searched) is not missing: reading it reports why."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def _files(
    paths: list[str], missing: list[str], overrides: Overrides
) -> tuple[list[Path], list[FileResult]]:
    """The files to lint: what `discover` finds, less the excluded ones (Ruff's way:
    a path named on the command line is linted unless `force-exclude` is set); and an
    error for each folder that could not be listed."""
    given = [Path(p) for p in paths if p not in missing and p != "-"]
    unlisted: list[FileResult] = []

    def unreadable(error: OSError) -> None:
        message = f"1:1: error: {os_error_message(error)}"
        unlisted.append(FileResult(str(error.filename), error=message))

    def walked_and_excluded(path: Path) -> bool:
        return overrides.apply(settings_for(path)).excludes(path)

    def given_and_excluded(path: Path) -> bool:
        settings = overrides.apply(settings_for(path))
        return settings.force_exclude and settings.excludes(path, ancestors=True)

    files = [
        path
        for path in discover(map(str, given), walked_and_excluded, unreadable)
        if path not in given or not given_and_excluded(path)
    ]
    return files, unlisted


def _unlinted_imports(
    named: list[FileResult], results: list[FileResult], overrides: Overrides
) -> list[str]:
    """A note for each local module that a script named on the command line (`named`)
    imports, that was not linted (is not in `results`), and that has findings: `lint
    main.py` says nothing of the step in the `solver.py` it imports (Ruff's way: only the
    paths given are reported)."""
    linted = {os.path.realpath(result.path) for result in results}  # a link loop too
    importers: dict[Path, str] = {}
    for result in named:
        for module in result.imports:
            path = _shown(Path(module))
            if os.path.realpath(path) not in linted:
                importers.setdefault(path, result.path)
    found = lint_files(sorted(importers), overrides, Mode.CHECK) if importers else []
    return [
        f"note: {result.path} (imported by {importers[Path(result.path)]}) has"
        f" {len(result.diagnostics)} finding{'s' * (len(result.diagnostics) != 1)} not shown;"
        " lint it too"
        for result in found
        if result.diagnostics
    ]


def _shown(path: Path) -> Path:
    """`path` relative to the working folder when it is below it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _would_fix_text(results: list[FileResult]) -> str:
    """Ruff's closing line for `--diff`."""
    fixable = sum(r.fixed for r in results)
    if not fixable:
        return "No errors would be fixed."
    return f"Would fix {fixable} error{'s' * (fixable != 1)}."


def _lint_stdin(overrides: Overrides, mode: Mode, name: Path | None) -> list[FileResult]:
    """`-`: lint standard input, as the file `name` when given (Ruff's `--stdin-filename`:
    its settings, excludes with `--force-exclude`, and local imports); with --fix, the
    fixed text goes to stdout (Ruff's way)."""
    settings = overrides.apply(settings_for(name or Path.cwd()))
    display = str(name or "-")
    limit = overrides.max_file_size
    text = sys.stdin.read(limit + 1)
    if len(text) > limit:
        return [
            FileResult(path=display, error=f"1:1: error: larger than {mebibytes(limit)}; not read")
        ]
    if name is not None and settings.force_exclude and settings.excludes(name, ancestors=True):
        if mode is Mode.FIX:
            sys.stdout.write(text)
        return []
    result = lint_text(text, display, settings, mode, script=name)
    if mode is Mode.FIX:
        sys.stdout.write(result.fixed_source if result.fixed_source is not None else text)
    return [result]
