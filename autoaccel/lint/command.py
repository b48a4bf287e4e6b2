"""`autoaccel lint`: discover files, lint them, print, and choose the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

from autoaccel.config import ConfigError, settings_for
from autoaccel.discovery import discover
from autoaccel.fileio import MAX_SOURCE_BYTES
from autoaccel.lint.output import FORMATTERS, statistics_text, summary_text
from autoaccel.lint.output_format import OutputFormat
from autoaccel.lint.runner import FileResult, Mode, Overrides, lint_files, lint_text

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


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
) -> int:
    """Lint `paths` and print the report; returns Ruff's exit code."""
    overrides = Overrides(select, extend_select, ignore, unsafe_fixes)
    mode = Mode.DIFF if diff else Mode.FIX if fix else Mode.CHECK
    missing = [p for p in paths if p != "-" and not Path(p).exists()]
    for path in missing:
        print(f"{path}:1:1: error: no such file or directory", file=sys.stderr)
    try:
        results = _lint_stdin(overrides, mode) if paths == ["-"] else lint_files(
            discover(p for p in paths if p not in missing and p != "-"), overrides, mode
        )
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR

    for result in results:
        if result.error:
            print(f"{result.path}:{result.error}", file=sys.stderr)
    # With `--fix` on stdin, stdout carries the fixed source, so findings go to stderr.
    report = sys.stderr if paths == ["-"] and mode is Mode.FIX else sys.stdout
    if mode is Mode.DIFF:
        report.write("".join(r.diff for r in results))
    elif statistics:
        report.write(statistics_text(results))
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

    if missing or any(r.error for r in results):
        return EXIT_ERROR
    if exit_zero:
        return EXIT_CLEAN
    if mode is Mode.DIFF:
        return EXIT_FINDINGS if any(r.diff for r in results) else EXIT_CLEAN
    return EXIT_FINDINGS if any(r.diagnostics for r in results) else EXIT_CLEAN


def _would_fix_text(results: list[FileResult]) -> str:
    """Ruff's closing line for `--diff`."""
    fixable = sum(r.fixed for r in results)
    if not fixable:
        return "No errors would be fixed."
    return f"Would fix {fixable} error{'s' * (fixable != 1)}."


def _lint_stdin(overrides: Overrides, mode: Mode) -> list[FileResult]:
    """`-`: lint standard input; with --fix, the fixed text goes to stdout (Ruff's way)."""
    settings = overrides.apply(settings_for(Path.cwd()))
    text = sys.stdin.read(MAX_SOURCE_BYTES + 1)
    if len(text) > MAX_SOURCE_BYTES:
        limit = MAX_SOURCE_BYTES // 2**20
        return [FileResult(path="-", error=f"1:1: error: larger than {limit} MiB; not read")]
    result = lint_text(text, "-", settings, mode)
    if mode is Mode.FIX:
        sys.stdout.write(result.fixed_source if result.fixed_source is not None else text)
    return [result]
