"""The `autoaccel` command line. Commands import their machinery lazily so that
start-up stays light (pre-commit runs `autoaccel lint` on every commit)."""

from __future__ import annotations

import sys
from pathlib import Path
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


@app.command()
def convert(
    file: Path = typer.Argument(..., help="The training script to convert."),
    to: str = typer.Option("single", "--to", help="single | dp | ddp"),
    amp: str = typer.Option("bf16", "--amp", help="Mixed precision: bf16 | fp16 | off."),
    compile_model: bool = typer.Option(False, "--compile", help="Compile the model (torch.compile)."),
    channels_last: bool = typer.Option(False, "--channels-last", help="NHWC memory format."),
    sync_bn: bool = typer.Option(False, "--sync-bn", help="ddp: BatchNorm becomes SyncBatchNorm."),
    per_process_batch: bool = typer.Option(
        False, "--per-process-batch", help="ddp: keep the batch size per process (default: global)."
    ),
    launcher: str = typer.Option("torchrun", "--launcher", help="ddp: torchrun | slurm | spawn"),
    diff: bool = typer.Option(False, "--diff", help="Show the diff and a summary (the default)."),
    write: bool = typer.Option(False, "--write", help="Rewrite the file in place."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the result here."),
    check: bool = typer.Option(False, "--check", help="Exit 1 when the script would change."),
    report_format: str = typer.Option("text", "--format", help="text | markdown | json"),
) -> None:
    """Rewrite a single-GPU training script into a fast one (diff preview by default)."""
    from autoaccel.convert.command import run_convert
    from autoaccel.convert.log import ConvertOptions

    _choice("--to", to, ("single", "dp", "ddp"))
    _choice("--amp", amp, ("bf16", "fp16", "off"))
    _choice("--format", report_format, ("text", "markdown", "json"))
    _choice("--launcher", launcher, ("torchrun", "slurm", "spawn"))
    if write and output is not None:
        raise typer.BadParameter("use either --write or -o, not both")
    options = ConvertOptions(
        target=to,  # type: ignore[arg-type]
        amp=amp,  # type: ignore[arg-type]
        compile=compile_model,
        channels_last=channels_last,
        sync_bn=sync_bn,
        per_process_batch=per_process_batch,
        launcher=launcher,  # type: ignore[arg-type]
    )
    raise typer.Exit(run_convert(file, options, write, output, check, report_format))


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}", param_hint=option)


def main() -> None:
    app(prog_name="autoaccel")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
