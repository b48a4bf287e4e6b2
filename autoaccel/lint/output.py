"""Report formats: text (humans), json, github (workflow annotations), sarif (2.1.0)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any
from collections.abc import Callable
from urllib.parse import quote

from autoaccel import __version__
from autoaccel.diff import BOLD, CYAN, RED, paint
from autoaccel.lint.output_format import OutputFormat
from autoaccel.lint.rule import Applicability, Diagnostic, LintRule
from autoaccel.lint.runner import FileResult
from autoaccel.notebook import CellRange

DOCS_URL = "https://github.com/autoaccel/autoaccel/blob/main/rules/"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _fixable(diagnostic: Diagnostic, unsafe_fixes: bool) -> bool:
    return diagnostic.fix_applicability is Applicability.SAFE or (
        unsafe_fixes and diagnostic.fix_applicability is Applicability.UNSAFE
    )


def _cell(result: FileResult, diagnostic: Diagnostic) -> CellRange | None:
    """Where a notebook finding is in cell terms (None for a Python file)."""
    return result.cells.get(diagnostic) if result.cells else None


def _message(result: FileResult, diagnostic: Diagnostic) -> str:
    """The message, with the cell named for notebook findings located in the raw `.ipynb`."""
    cell = _cell(result, diagnostic)
    return f"{diagnostic.message} ({cell})" if cell else diagnostic.message


def _unstyled(text: str, *styles: str) -> str:
    return text


def _printable(text: str) -> str:
    """`text` with its control characters written as Python escapes (`\\n`, `\\x1b`):
    a newline in a file name would split its finding's line, an escape sequence would
    drive the terminal."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


def format_text(results: list[FileResult], unsafe_fixes: bool = False, colour: bool = False) -> str:
    """One line per finding; with `colour`, Ruff's colours (bold path, red code, cyan `[*]`)."""
    style = paint if colour else _unstyled
    lines = []
    for result in results:
        for d in result.diagnostics:
            marker = " " + style("[*]", CYAN) if _fixable(d, unsafe_fixes) else ""
            where = _cell(result, d) or f"{d.line}:{d.column}"
            code = style(d.code, BOLD, RED)
            path, message = _printable(result.path), _printable(d.message)
            lines.append(f"{style(path, BOLD)}:{where}: {code}{marker} {message}")
    return "\n".join(lines) + ("\n" if lines else "")


def summary_text(results: list[FileResult], unsafe_fixes: bool = False) -> str:
    """Ruff's closing lines (printed on stderr). `[*] N fixable` counts the findings
    there are now; `--fix` re-lints after each round of fixes, and a fix could uncover a
    finding, so it says what it found in all: `Found 7 errors (6 fixed, 1 remaining).`"""
    diagnostics = [d for r in results for d in r.diagnostics]
    fixed = sum(r.fixed for r in results)
    count = len(diagnostics)
    lines = []
    if fixed:
        found = fixed + count
        lines.append(f"Found {found} error{'s' * (found != 1)} ({fixed} fixed, {count} remaining).")
    elif diagnostics:
        lines.append(f"Found {count} error{'s' * (count != 1)}.")
    if diagnostics:
        fixable = sum(_fixable(d, unsafe_fixes) for d in diagnostics)
        hidden = sum(d.fix_applicability is Applicability.UNSAFE for d in diagnostics)
        if fixable:
            lines.append(f"[*] {fixable} fixable with the `--fix` option.")
        if hidden and not unsafe_fixes:
            lines.append(
                f"{hidden} hidden fix{'es' * (hidden != 1)} can be enabled with the"
                " `--unsafe-fixes` option."
            )
    elif not fixed and not any(r.error for r in results):
        lines.append("All checks passed!")
    return "\n".join(lines)


def statistics_text(results: list[FileResult]) -> str:
    counts = Counter((d.code, d.name) for r in results for d in r.diagnostics)
    return "".join(
        f"{count:>5}\t{code}\t{name}\n"
        for (code, name), count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    )


def format_json(results: list[FileResult], unsafe_fixes: bool = False) -> str:
    """Ruff's fields; for a notebook, rows and columns are inside cell `cell`."""
    records = []
    for result in results:
        for d in result.diagnostics:
            where = _cell(result, d) or d
            records.append(
                {
                    "code": d.code,
                    "name": d.name,
                    "message": d.message,
                    "filename": _encodable(result.path),
                    "cell": where.cell if isinstance(where, CellRange) else None,
                    "location": {"row": where.line, "column": where.column},
                    "end_location": {"row": where.end_line, "column": where.end_column},
                    "fix": (
                        {"message": d.fix_title, "applicability": d.fix_applicability.value}
                        if d.fix_applicability is not None
                        else None
                    ),
                    "url": f"{DOCS_URL}{d.code}-{d.name}.md",
                }
            )
    return json.dumps(records, indent=2) + "\n"


def _encodable(path: str) -> str:
    """`path` with the bytes of its name that are not UTF-8 (held as surrogates)
    written as `\\xff` escapes: a JSON reader takes no lone surrogates."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _escape_github(value: str, property_value: bool = False) -> str:
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if property_value:
        value = value.replace(":", "%3A").replace(",", "%2C")
    return value


def format_github(results: list[FileResult], unsafe_fixes: bool = False) -> str:
    lines = []
    for result in results:
        file = _escape_github(result.path, property_value=True)
        for d in result.diagnostics:
            lines.append(
                f"::error title=autoaccel ({d.code}),file={file},line={d.line},"
                f"col={d.column},endLine={d.end_line},endColumn={d.end_column}::"
                f"{_escape_github(f'{d.code} {_message(result, d)}')}"
            )
    return "\n".join(lines) + ("\n" if lines else "")


def format_sarif(results: list[FileResult], unsafe_fixes: bool = False) -> str:
    """SARIF 2.1.0 as GitHub code scanning reads it: rules with their docs as help,
    one result per finding, located by repository-relative URIs."""
    from autoaccel.rules import all_rules

    rules = all_rules()
    index = {rule.code: position for position, rule in enumerate(rules)}
    document = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "autoaccel",
                        "version": __version__,
                        "informationUri": "https://github.com/autoaccel/autoaccel",
                        "rules": [_sarif_rule(rule) for rule in rules],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
                # Columns count characters, as Python strings do (SARIF's default is UTF-16).
                "columnKind": "unicodeCodePoints",
                "results": [
                    _sarif_result(result, d, index[d.code])
                    for result in results
                    for d in result.diagnostics
                ],
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def _sarif_rule(rule: type[LintRule]) -> dict[str, Any]:
    from autoaccel.docs import rule_doc, summary

    doc = rule_doc(rule.code) or rule.message
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.message},
        "fullDescription": {"text": summary(doc) or rule.message},
        "help": {"text": doc, "markdown": doc},
        "helpUri": f"{DOCS_URL}{rule.code}-{rule.name}.md",
        "defaultConfiguration": {"level": "warning"},
        "properties": {"fixable": rule.fix_title is not None},
    }


def _sarif_result(result: FileResult, d: Diagnostic, rule_index: int) -> dict[str, Any]:
    return {
        "ruleId": d.code,
        "ruleIndex": rule_index,
        "level": "warning",
        "message": {"text": _message(result, d)},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": _artifact_location(result.path),
                    "region": {
                        "startLine": d.line,
                        "startColumn": d.column,
                        "endLine": d.end_line,
                        "endColumn": d.end_column,
                    },
                }
            }
        ],
    }


def _artifact_location(path: str) -> dict[str, str]:
    """A URI relative to the project root (the working directory) where the file is
    inside it, which is what code scanning matches to the repository; else `file://`."""
    resolved = Path(path).resolve()
    if resolved.is_relative_to(Path.cwd().resolve()):
        relative = resolved.relative_to(Path.cwd().resolve()).as_posix()
        return {"uri": quote(os.fsencode(relative)), "uriBaseId": "%SRCROOT%"}
    return {"uri": resolved.as_uri()}


FORMATTERS: dict[OutputFormat, Callable[[list[FileResult], bool], str]] = {
    OutputFormat.text: format_text,
    OutputFormat.json: format_json,
    OutputFormat.github: format_github,
    OutputFormat.sarif: format_sarif,
}
