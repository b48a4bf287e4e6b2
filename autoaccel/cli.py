"""The `autoaccel` command line. Commands import their machinery lazily so that
start-up stays light (pre-commit runs `autoaccel lint` on every commit)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from autoaccel import __version__
from autoaccel.lint.output_format import OutputFormat

app = typer.Typer(
    name="autoaccel",
    help="Make PyTorch training scripts fast: lint slow patterns, convert scripts.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _codes(values: Optional[List[str]]) -> tuple[str, ...] | None:
    if not values:
        return None
    return tuple(code.strip().upper() for value in values for code in value.split(",") if code.strip())


def _version(value: bool) -> None:
    if value:
        typer.echo(f"autoaccel {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """Make PyTorch training scripts fast: lint slow patterns, convert scripts."""


@app.command()
def lint(
    paths: List[str] = typer.Argument(None, help="Files or directories; `-` reads stdin."),
    output_format: OutputFormat = typer.Option(
        OutputFormat.text, "--format", "--output-format", help="How findings are printed."
    ),
    select: Optional[List[str]] = typer.Option(None, help="Rule codes or prefixes to run."),
    extend_select: Optional[List[str]] = typer.Option(None, help="Codes to run in addition."),
    ignore: Optional[List[str]] = typer.Option(None, help="Rule codes or prefixes to skip."),
    fix: bool = typer.Option(False, "--fix", help="Apply fixes in place."),
    diff: bool = typer.Option(False, "--diff", help="Show what --fix would change; write nothing."),
    unsafe_fixes: bool = typer.Option(
        False, "--unsafe-fixes", help="Also apply fixes that may change numerics or sync."
    ),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings."),
    statistics: bool = typer.Option(False, "--statistics", help="Count findings per rule."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print findings only, no summary."),
) -> None:
    """Find slow patterns in PyTorch training scripts."""
    from autoaccel.lint.command import run_lint

    code = run_lint(
        paths=paths or ["."],
        output_format=output_format,
        select=_codes(select),
        extend_select=_codes(extend_select) or (),
        ignore=_codes(ignore) or (),
        fix=fix,
        diff=diff,
        unsafe_fixes=unsafe_fixes,
        exit_zero=exit_zero,
        statistics=statistics,
        quiet=quiet,
    )
    raise typer.Exit(code)


@app.command()
def rules(code: Optional[str] = typer.Argument(None, help="A rule code, e.g. ACC101.")) -> None:
    """List the rules, or print one rule's documentation."""
    from autoaccel.docs import rule_doc
    from autoaccel.rules import all_rules, rule_by_code

    if code is None:
        for rule in all_rules():
            fixable = "fix" if rule.fix_title else "   "
            typer.echo(f"{rule.code}  {fixable}  {rule.name:<36} {rule.message}")
        return
    rule = rule_by_code(code)
    doc = rule_doc(code) if rule else None
    if rule is None or doc is None:
        typer.echo(f"error: unknown rule code {code!r} (see `autoaccel rules`)", err=True)
        raise typer.Exit(2)
    typer.echo(doc, nl=False)


def main() -> None:
    app(prog_name="autoaccel")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
