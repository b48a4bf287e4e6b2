"""`autoaccel convert`: read, convert, check, then print, write or compare."""

from __future__ import annotations

import sys
from pathlib import Path

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import ConversionError, convert_source
from autoaccel.convert.report import json_report, markdown_report, text_report
from autoaccel.diff import use_colour
from autoaccel.fileio import read_source, write_atomic
from autoaccel.lint.engine import SourceError

EXIT_OK, EXIT_CHANGED, EXIT_ERROR = 0, 1, 2


def run_convert(
    path: Path,
    options: ConvertOptions,
    write: bool = False,
    output: Path | None = None,
    check: bool = False,
    report_format: str = "text",
) -> int:
    """Convert one file; nothing is written unless every safety check passed."""
    try:
        source = read_source(path)
    except (OSError, UnicodeDecodeError, SyntaxError) as error:
        print(f"{path}:1:1: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        conversion = convert_source(source.text, options, str(path))
    except SourceError as error:
        print(f"{path}:{error.line}:{error.column}: {error.message}", file=sys.stderr)
        return EXIT_ERROR
    except ConversionError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return EXIT_ERROR

    if report_format == "markdown":
        sys.stdout.write(markdown_report(conversion, str(path)))
    elif report_format == "json":
        sys.stdout.write(json_report(conversion, str(path)))
    elif not (write or output) or conversion.log.changes:
        sys.stdout.write(text_report(conversion, str(path), use_colour()))

    if output is not None:
        write_atomic(output, conversion.converted, source.encoding)
    elif write and conversion.changed:
        write_atomic(path, conversion.converted, source.encoding)
    if output is not None or write:
        folder = (output or path).parent
        for name, text in conversion.log.extra_files.items():
            write_atomic(folder / name, text, "utf-8")
    if check and conversion.changed:
        return EXIT_CHANGED
    return EXIT_OK
