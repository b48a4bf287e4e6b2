"""`autoaccel convert`: read, convert, check, then print, write or compare."""

from __future__ import annotations

import sys
import tempfile
import traceback
from pathlib import Path

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import Conversion, ConversionError, convert_source
from autoaccel.convert.report import json_report, markdown_report, text_report
from autoaccel.diff import use_colour
from autoaccel.fileio import read_source, write_atomic
from autoaccel.lint.engine import SourceError
from autoaccel.notebook import Notebook, NotebookError, is_notebook, read_notebook

EXIT_OK, EXIT_CHANGED, EXIT_ERROR = 0, 1, 2  # EXIT_CHANGED also: refused


def run_convert(
    path: Path,
    options: ConvertOptions,
    write: bool = False,
    output: Path | None = None,
    check: bool = False,
    report_format: str = "text",
    allow_partial: bool = False,
) -> int:
    """Convert one file (a script, or a notebook's code cells); nothing is written
    unless every safety check passed, nor a result that would train wrongly (unless
    `allow_partial`)."""
    notebook: Notebook | None = None
    try:
        if is_notebook(path):
            if options.target != "single":
                raise NotebookError("notebooks convert with `--to single` only")
            notebook = read_notebook(path)
            text, encoding = notebook.python, "utf-8"
        else:
            source = read_source(path)
            text, encoding = source.text, source.encoding
    except (OSError, UnicodeDecodeError, SyntaxError, NotebookError) as error:
        print(f"{path}:1:1: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        # The launch commands of `--to ddp` name the script that will run.
        conversion = convert_source(text, options, str(output or path), str(path))
        converted = notebook.with_python(conversion.converted) if notebook else conversion.converted
    except SourceError as error:
        where = f"{error.line}:{error.column}"
        if notebook is not None:
            where = str(notebook.cell_range(error.line, error.column, error.line, error.column))
        print(f"{path}:{where}: {error.message}", file=sys.stderr)
        return EXIT_ERROR
    except ConversionError as error:
        print(f"{path}: {error}{_details_saved(error.details)}", file=sys.stderr)
        return EXIT_ERROR
    except NotebookError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:  # noqa: BLE001 - a bug in a step: one line, never a traceback
        first_line = (str(error).splitlines() or [""])[0]
        details = _details_saved(traceback.format_exc())
        print(f"{path}: internal error: {type(error).__name__}: {first_line}{details}", file=sys.stderr)
        return EXIT_ERROR

    _print_report(_readable(conversion, notebook), str(path), report_format, write or output)
    wrong = [s for s in conversion.log.skipped if s.wrong]
    level = "warning" if allow_partial else "error"
    for item in wrong:
        where = f"{path}:{item.line}:1" if item.line else str(path)
        print(f"{where}: {level}: {item.what} not applied: {item.reason}", file=sys.stderr)
    if wrong and not allow_partial:
        print(
            f"{path}: error: --to {options.target} refused: the result would not train like the"
            " original (see above); nothing written. `--allow-partial` writes it anyway.",
            file=sys.stderr,
        )
        return EXIT_CHANGED
    try:
        if output is not None:
            write_atomic(output, converted, encoding)
        elif write and conversion.changed:
            write_atomic(path, converted, encoding)
        if output is not None or write:
            folder = (output or path).parent
            for name, text in conversion.log.extra_files.items():
                write_atomic(folder / name, text, "utf-8")
    except OSError as error:
        print(f"{output or path}: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if check and conversion.changed:
        return EXIT_CHANGED
    return EXIT_OK


def _details_saved(details: str) -> str:
    """Black's way with an internal error: the long part goes to a log file, the
    message says where (empty when there is nothing to save or no file to save it in)."""
    if not details:
        return ""
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix="autoaccel-convert-", suffix=".log", delete=False, encoding="utf-8"
        ) as log:
            log.write(details)
    except OSError:
        return ""
    return f" (details: {log.name})"


def _readable(conversion: Conversion, notebook: Notebook | None) -> Conversion:
    """For a notebook, the conversion of its cells shown as a percent script
    (`# %% [cell N]` headers, magics as written) so that the diff reads like the notebook."""
    if notebook is None:
        return conversion
    return Conversion(
        notebook.render(conversion.original), notebook.render(conversion.converted), conversion.log
    )


def _print_report(conversion: Conversion, path: str, report_format: str, writing: bool) -> None:
    if report_format == "markdown":
        sys.stdout.write(markdown_report(conversion, path))
    elif report_format == "json":
        sys.stdout.write(json_report(conversion, path))
    elif not writing or conversion.log.changes or conversion.log.skipped:
        sys.stdout.write(text_report(conversion, path, use_colour()))
