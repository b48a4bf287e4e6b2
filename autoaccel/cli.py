"""The `autoaccel` command line. Commands import their machinery lazily so that
start-up stays light (pre-commit runs `autoaccel lint` on every commit)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from autoaccel import __version__
from autoaccel.lint.output_format import OutputFormat

if TYPE_CHECKING:
    from autoaccel.convert.log import ConvertOptions


class _Command(typer.core.TyperCommand):
    """A command whose help names an argument by its metavar alone (`FILE`), as it names
    options, where typer would add a Python type (`FILE <path>`, `PATHS <list[str]>`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, typer.core.TyperArgument) and param.metavar:
                param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]


app = typer.Typer(
    name="autoaccel",
    help="Make PyTorch training scripts fast: lint slow patterns, convert scripts.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion, --show-completion (typer's)
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _codes(values: list[str] | None) -> tuple[str, ...] | None:
    if not values:
        return None
    return tuple(
        code.strip().upper() for value in values for code in value.split(",") if code.strip()
    )


_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _size(text: str) -> int:
    """`--max-file-size`: a whole number of bytes, KiB, MiB or GiB."""
    match = re.fullmatch(r"\s*(\d+)\s*(KiB|MiB|GiB)?\s*", text)
    if match is None or int(match[1]) == 0:
        raise typer.BadParameter(
            f"{text!r} is not a size such as 2000000, 512KiB or 2MiB", param_hint="--max-file-size"
        )
    return int(match[1]) * _UNITS.get(match[2], 1)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"autoaccel {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "-V",
        "--version",
        callback=_version,
        is_eager=True,
        help="Show the version and exit.",
    ),
) -> None:
    """Make PyTorch training scripts fast: lint slow patterns, convert scripts."""


@app.command(cls=_Command)
def lint(
    paths: list[str] = typer.Argument(
        None, metavar="PATHS", help="Files or directories; `-` reads stdin."
    ),
    output_format: OutputFormat = typer.Option(
        OutputFormat.text,
        "--format",
        "--output-format",
        metavar="FORMAT",
        help="How findings are printed: text | json | github | sarif.",
    ),
    select: list[str] | None = typer.Option(
        None, metavar="CODES", help="Rule codes or prefixes to run."
    ),
    extend_select: list[str] | None = typer.Option(
        None, metavar="CODES", help="Codes to run in addition."
    ),
    ignore: list[str] | None = typer.Option(
        None, metavar="CODES", help="Rule codes or prefixes to skip."
    ),
    fix: bool = typer.Option(False, "--fix", help="Apply fixes in place."),
    diff: bool = typer.Option(False, "--diff", help="Show what --fix would change; write nothing."),
    unsafe_fixes: bool = typer.Option(
        False, "--unsafe-fixes", help="Also apply fixes that may change numerics or sync."
    ),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even with findings."),
    statistics: bool = typer.Option(False, "--statistics", help="Count findings per rule."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print findings only, no summary."),
    force_exclude: bool = typer.Option(
        False, "--force-exclude", help="Apply `exclude` to the paths given too (for hooks)."
    ),
    stdin_filename: Path | None = typer.Option(
        None,
        "--stdin-filename",
        metavar="PATH",
        help="The path of the script read from stdin (`-`): for messages, config and its local imports.",
    ),
    max_file_size: str = typer.Option(
        "1MiB",
        "--max-file-size",
        metavar="SIZE",
        help="A larger file is reported, not read: bytes, or 512KiB, 2MiB.",
    ),
    precise: bool = typer.Option(
        False,
        "--precise",
        help="Unless pyproject.toml sets `select`, run only the rules whose findings are certain"
        " and cheap to act on (what the pre-commit hooks enforce).",
    ),
) -> None:
    """Find slow patterns in PyTorch training scripts."""
    from autoaccel.lint.command import run_lint

    if stdin_filename is not None and paths != ["-"]:
        raise typer.BadParameter(
            "names the script read from stdin: give `-` as the path", param_hint="--stdin-filename"
        )
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
        force_exclude=force_exclude,
        stdin_filename=stdin_filename,
        precise=precise,
        max_file_size=_size(max_file_size),
    )
    raise typer.Exit(code)


@app.command(cls=_Command)
def rules(
    code: str | None = typer.Argument(None, metavar="CODE", help="A rule code, e.g. ACC101."),
) -> None:
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


# Convert options shared by the commands that convert (`convert`, `config`, `bench`):
# left at None, a value comes from [tool.autoaccel.convert] or the default.
TO_OPTION = typer.Option(
    None, "--to", metavar="TARGET", help="single | dp | ddp | fsdp [default: single]"
)
AMP_OPTION = typer.Option(
    None, "--amp", metavar="PRECISION", help="bf16 | fp16 | off [default: bf16]"
)
COMPILE_OPTION = typer.Option(
    None, "--compile/--no-compile", help="Compile the model (torch.compile)."
)
CHANNELS_LAST_OPTION = typer.Option(
    None, "--channels-last/--no-channels-last", help="NHWC memory format."
)


@app.command(
    cls=_Command,
    short_help="Rewrite a training script into a fast one (a diff preview unless --write or -o).",
)
def convert(
    ctx: typer.Context,
    file: Path = typer.Argument(
        ...,
        metavar="FILE",
        help="The training script or notebook to convert; `-` reads it from stdin.",
    ),
    to: str | None = TO_OPTION,
    amp: str | None = AMP_OPTION,
    compile_model: bool | None = COMPILE_OPTION,
    channels_last: bool | None = CHANNELS_LAST_OPTION,
    sync_bn: bool | None = typer.Option(
        None, "--sync-bn/--no-sync-bn", help="ddp: BatchNorm becomes SyncBatchNorm."
    ),
    per_process_batch: bool | None = typer.Option(
        None,
        "--per-process-batch/--global-batch",
        help="ddp: keep the batch size per process (default: global).",
    ),
    launcher: str | None = typer.Option(
        None,
        "--launcher",
        metavar="LAUNCHER",
        help="ddp: torchrun | slurm | spawn [default: torchrun]",
    ),
    cpu_offload: bool | None = typer.Option(
        None,
        "--cpu-offload/--no-cpu-offload",
        help="fsdp: keep parameters, gradients and optimizer state on the CPU between uses.",
    ),
    workers: str | None = typer.Option(
        None,
        "--workers",
        metavar="WORKERS",
        help="DataLoader workers: auto (from the CPU count) | keep [default: auto]",
    ),
    diff: bool = typer.Option(False, "--diff", help="Show the diff and a summary (the default)."),
    write: bool = typer.Option(
        False, "--write", help="Rewrite the file (and the project modules that change) in place."
    ),
    output: Path | None = typer.Option(
        None,
        "-o",
        "--output",
        metavar="PATH",
        help="Write the result here (a folder when project modules change too; `-`: stdout).",
    ),
    stdin_filename: Path | None = typer.Option(
        None,
        "--stdin-filename",
        metavar="PATH",
        help="The path of the script read from stdin (`-`): for messages, config and its local imports.",
    ),
    check: bool = typer.Option(False, "--check", help="Exit 1 when the script would change."),
    allow_partial: bool = typer.Option(
        False,
        "--allow-partial",
        help="Write a --to ddp result even where a part the result needs to train correctly"
        " could not be made (listed as errors).",
    ),
    report_format: str = typer.Option(
        "text", "--format", metavar="FORMAT", help="text | markdown | json"
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace launcher files (train.sbatch, spawn_train.py) that exist."
    ),
    verify: bool | None = typer.Option(
        None,
        "--verify/--no-verify",
        help="ddp, fsdp: prove the result first: run it on 2 CPU processes (gloo) for a few steps"
        " and check it trains like the original; nothing is written when a check fails or the"
        " original does not run. On when --write or -o FILE writes the result; --verify proves"
        " a preview too, --no-verify writes unproven.",
    ),
    verify_steps: int = typer.Option(
        20, "--verify-steps", min=1, metavar="N", help="Training steps the proof runs."
    ),
    no_run: bool = typer.Option(
        False,
        "--no-run",
        help="ddp, fsdp, dp: never run the script (no proof either, unless --verify). Without"
        " it, where the code alone does not show which model trains (ddp, fsdp) or whether"
        " what a model gets is batch-first (dp), the script runs for a few steps in a child"
        " process to find out.",
    ),
    script_args: list[str] | None = typer.Argument(
        None,
        metavar="SCRIPT_ARGS",
        help="The script's arguments, after `--`: for the short run (ddp, fsdp, dp) and the proof (ddp, fsdp).",
    ),
) -> None:
    """Rewrite a single-GPU training script into a fast one (diff preview by default).
    Option defaults come from [tool.autoaccel.convert] in pyproject.toml."""
    from autoaccel.config import ConfigError
    from autoaccel.convert.command import STDIN, STDOUT, run_convert
    from autoaccel.convert.log import RUNS_THE_SCRIPT
    from autoaccel.convert.settings import convert_options
    from autoaccel.convert.verify import VerifyRequest
    from autoaccel.run.facts import FactsRequest

    if script_args and verify is not True and no_run:
        raise typer.BadParameter(
            f"unexpected arguments {' '.join(script_args)!r} (the script's arguments, after `--`, are for the runs of --to ddp, fsdp and dp)"
        )
    _choice("--format", report_format, ("text", "markdown", "json"))
    if write and output is not None:
        raise typer.BadParameter("use either --write or -o, not both")
    if diff and (write or output is not None):
        # Black's --diff never writes; a preview that also writes would surprise.
        raise typer.BadParameter("--diff writes nothing: use it without --write and -o")
    from_stdin = file == STDIN
    if from_stdin:
        if write or verify is True:
            raise typer.BadParameter("stdin (`-`) takes neither --write nor --verify")
        if output is None and not (diff or check):  # Black's way: the result on stdout
            output = STDOUT
    elif stdin_filename is not None:
        raise typer.BadParameter(
            "names the script read from stdin: give `-` as the file", param_hint="--stdin-filename"
        )
    file = stdin_filename or file
    try:
        options = convert_options(file, _convert_command_line(ctx.params))
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    _check_distributed(options, verify is True)
    if script_args and options.target not in RUNS_THE_SCRIPT:
        raise typer.BadParameter(
            f"unexpected arguments {' '.join(script_args)!r} (the script's arguments, after `--`, are for the runs of --to ddp, fsdp and dp)"
        )
    unproven = _unproven(options, verify, no_run, write or output not in (None, STDOUT), from_stdin)
    request = (
        VerifyRequest(script_args or [], verify_steps, per_process_batch=options.per_process_batch)
        if unproven is None
        else None
    )
    # A run only where the target needs to know which model trains, of a script on disk;
    # when there is a proof, as long as its run of the original, which it then is too.
    facts = None if no_run or from_stdin else FactsRequest(script_args or [])
    if facts is not None and request is not None:
        facts = FactsRequest(facts.script_args, request.steps, request.timeout, request.epoch_steps)
    raise typer.Exit(
        run_convert(
            file,
            options,
            write,
            output,
            check,
            report_format,
            allow_partial,
            force,
            request,
            from_stdin,
            facts,
            unproven or "",
        )
    )


def _unproven(
    options: ConvertOptions, verify: bool | None, no_run: bool, writes: bool, from_stdin: bool
) -> str | None:
    """Why the conversion is not proven (run before it is written); None when it is, and
    empty where there is no proof to speak of (other targets, stdin)."""
    from autoaccel.convert.log import MULTI_PROCESS

    if options.target not in MULTI_PROCESS or from_stdin:
        return ""
    if verify:
        return None
    if verify is False:
        return "--no-verify: nothing ran it"
    if no_run:
        return "--no-run: nothing ran it"
    if not writes:
        return "a preview runs nothing; --write or -o FILE runs the proof before writing (--verify runs it now)"
    return None


def _convert_command_line(params: dict[str, object]) -> dict[str, object]:
    """The `ConvertOptions` fields given on a `convert` command line."""
    from dataclasses import fields

    from autoaccel.convert.log import ConvertOptions

    names = {f.name for f in fields(ConvertOptions)}
    renamed = {"to": "target", "compile_model": "compile"}
    given = {renamed.get(param, param): value for param, value in params.items()}
    return {name: value for name, value in given.items() if name in names and value is not None}


@app.command(
    cls=_Command, context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def config(
    ctx: typer.Context,
    path: Path = typer.Argument(Path("."), metavar="PATH", help="A file or folder."),
) -> None:
    """Print the settings in effect for PATH and where each comes from. Convert options
    after PATH (`autoaccel config train.py --to ddp`) count as given on the command line."""
    from autoaccel.config import ConfigError
    from autoaccel.config_report import effective_config

    command = typer.main.get_command(app).commands["convert"]  # type: ignore[attr-defined]
    try:
        parsed = command.make_context("convert", [str(path), *ctx.args], parent=ctx)
        typer.echo(effective_config(path, _convert_command_line(parsed.params)), nl=False)
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None


@app.command(
    cls=_Command, short_help="Time the script's DataLoaders under settings and show the fastest."
)
def tune(
    script: Path = typer.Argument(..., metavar="SCRIPT", help="The training script."),
    script_args: list[str] | None = typer.Argument(
        None, metavar="SCRIPT_ARGS", help="Its arguments, after `--`."
    ),
    batches: int = typer.Option(
        50, "--batches", min=1, metavar="N", help="Batches timed per pass."
    ),
    repeats: int = typer.Option(
        3, "--repeats", min=1, metavar="N", help="Timed passes per setting (median)."
    ),
    max_workers: int | None = typer.Option(
        None,
        "--max-workers",
        min=0,
        metavar="N",
        help="Largest num_workers tried [default: CPU count].",
    ),
    write: bool = typer.Option(False, "--write", help="Write the best settings into the script."),
    as_json: bool = typer.Option(False, "--json", help="Print the measurements as JSON."),
) -> None:
    """Time the script's DataLoaders under a sweep of settings and show the fastest."""
    from autoaccel.tune.command import run_tune

    raise typer.Exit(
        run_tune(script, script_args or [], batches, repeats, max_workers, write, as_json)
    )


@app.command(
    cls=_Command, short_help="Time the script and its conversion; compare speed, memory, losses."
)
def bench(
    ctx: typer.Context,
    script: Path = typer.Argument(..., metavar="SCRIPT", help="The training script."),
    script_args: list[str] | None = typer.Argument(
        None, metavar="SCRIPT_ARGS", help="Its arguments, after `--`."
    ),
    to: str | None = TO_OPTION,
    amp: str | None = AMP_OPTION,
    compile_model: bool | None = COMPILE_OPTION,
    channels_last: bool | None = CHANNELS_LAST_OPTION,
    steps: int = typer.Option(50, "--steps", min=2, metavar="N", help="Training steps per run."),
    warmup: int = typer.Option(
        5, "--warmup", min=1, metavar="N", help="Steps left out of the timing."
    ),
    tolerance: float | None = typer.Option(
        None,
        "--tolerance",
        min=0,
        metavar="FRACTION",
        help="Largest relative loss difference [default: by options].",
    ),
    nproc: int | None = typer.Option(
        None,
        "--nproc",
        min=1,
        metavar="N",
        help="ddp: processes [default: one per GPU, 2 without].",
    ),
    repeats: int = typer.Option(
        3,
        "--repeats",
        min=1,
        metavar="N",
        help="Runs of each side, alternated (3 or more to judge speed).",
    ),
    allow_slower: bool = typer.Option(
        False, "--allow-slower", help="Exit 0 when the conversion is measurably slower."
    ),
    report: Path | None = typer.Option(
        None, "--report", metavar="FOLDER", help="Write bench.json, .png, .html here."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="ddp, fsdp: also check the runs as `convert --verify` does (exit 1 on a failure).",
    ),
) -> None:
    """Run the script and its conversion for N steps each, alternately, --repeats times;
    compare speed, memory and loss curves (exit 1 when they diverge or the conversion is
    slower beyond the spread of the runs)."""
    from autoaccel.bench.command import run_bench
    from autoaccel.config import ConfigError
    from autoaccel.convert.settings import convert_options

    if warmup >= steps:
        raise typer.BadParameter("must be smaller than --steps", param_hint="--warmup")

    try:
        options = convert_options(script, _convert_command_line(ctx.params))
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    _check_distributed(options, verify)
    raise typer.Exit(
        run_bench(
            script,
            script_args or [],
            options,
            steps,
            warmup,
            tolerance,
            report,
            as_json,
            nproc,
            repeats,
            allow_slower,
            verify,
        )
    )


def _check_distributed(options: ConvertOptions, verify: bool) -> None:
    """The options that only some targets take."""
    from autoaccel.convert.log import MULTI_PROCESS

    if verify and options.target not in MULTI_PROCESS:
        raise typer.BadParameter("--verify checks --to ddp and --to fsdp conversions")
    if options.target == "fsdp" and options.amp == "fp16":
        raise typer.BadParameter(
            "--to fsdp computes in bf16 (MixedPrecisionPolicy) or fp32: use --amp bf16 or off"
        )
    if options.cpu_offload and options.target != "fsdp":
        raise typer.BadParameter("--cpu-offload shards with --to fsdp only")


def _choice(option: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(allowed)}", param_hint=option)


def main() -> None:
    """Every command, parsed by typer (`autoaccel.__main__` runs plain lint calls without)."""
    app(prog_name="autoaccel")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
