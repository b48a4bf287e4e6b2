"""`autoaccel convert`: read, convert, check, then print, write or compare."""

from __future__ import annotations

import sys
import tempfile
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from autoaccel.convert.log import MULTI_PROCESS, ConvertOptions, Skipped, left_to_proof, refusals
from autoaccel.convert.pipeline import Conversion, ConversionError, convert_source
from autoaccel.convert.project_conversion import (
    Project,
    ProjectConversion,
    convert_project,
    find_project,
)
from autoaccel.convert.report import (
    json_report,
    markdown_report,
    nothing_to_do_report,
    text_report,
    without_launch,
)
from autoaccel.convert.transforms.data_parallel.step_segments import RUN_CAN_TELL
from autoaccel.convert.transforms.distributed.init_process_group import ALREADY_DISTRIBUTED
from autoaccel.convert.verify import (
    ORIGINAL_RUNS,
    Proof,
    VerifyRequest,
    WriteConversion,
    verify_ddp,
    write_one,
)
from autoaccel.diff import use_colour
from autoaccel.facts.run import FactsRequest
from autoaccel.fileio import (
    MAX_SOURCE_BYTES,
    FileRefused,
    SourceFile,
    mebibytes,
    os_error_message,
    read_bytes,
    read_source,
    write_atomic,
)
from autoaccel.lint.engine import TOO_DEEP, SourceError
from autoaccel.notebook import Notebook, NotebookError, is_notebook, read_notebook

if TYPE_CHECKING:
    from autoaccel.bench.runner import Run
    from autoaccel.facts.resolve import ConversionFacts

EXIT_OK, EXIT_CHANGED, EXIT_ERROR = 0, 1, 2  # EXIT_CHANGED also: refused
STDIN = STDOUT = Path("-")  # `convert -` reads the script from stdin; `-o -` prints the result


def report_stream(output: Path | None) -> TextIO:
    """Where the report goes: stderr when stdout carries the converted code."""
    return sys.stderr if output == STDOUT else sys.stdout


def _file_output(output: Path | None) -> Path | None:
    """The file or folder `-o` writes to (None for none, or for stdout)."""
    return None if output == STDOUT else output


def _read_stdin() -> SourceFile:
    """The script on stdin, at most `MAX_SOURCE_BYTES` of it (`FileRefused` beyond)."""
    text = sys.stdin.read(MAX_SOURCE_BYTES + 1)
    if len(text) > MAX_SOURCE_BYTES:
        raise FileRefused(f"larger than {mebibytes(MAX_SOURCE_BYTES)}; not read")
    return SourceFile(text, "utf-8", text.encode("utf-8"))


def run_convert(
    path: Path,
    options: ConvertOptions,
    write: bool = False,
    output: Path | None = None,
    check: bool = False,
    report_format: str = "text",
    allow_partial: bool = False,
    force: bool = False,
    verify: VerifyRequest | None = None,
    from_stdin: bool = False,
    facts: FactsRequest | None = None,
    unproven: str = "",
) -> int:
    """Convert one file (a script, or a notebook's code cells); nothing is written
    unless every safety check passed, nor a result that would train wrongly (unless
    `allow_partial`), nor one that fails `verify` (a run on two processes; the report
    lists the checks it passed, or says `unproven`, why none ran). Launcher
    files that exist with other contents are kept unless `force`.
    `from_stdin`: the file's text is read from stdin, `path` only names it (Black's
    `--stdin-filename`). `output` `STDOUT`: the result goes to stdout, the report to stderr.
    `facts`: where the static conversion of a script (with the modules of its project,
    not a notebook) finds no trained model (ddp, fsdp) or cannot tell whether an input is
    batch-first (dp), run it for a few steps and convert again with what the run showed
    (`autoaccel.facts`); None: never run it
    (`--no-run`). A run for facts of as many steps as `verify` takes is the original's
    run of the proof too."""
    notebook: Notebook | None = None
    try:
        source = _read_stdin() if from_stdin else None
        if is_notebook(path):
            if options.target != "single":
                raise NotebookError("notebooks convert with `--to single` only")
            notebook = Notebook(source.text) if source else read_notebook(path)
            text, encoding, original = notebook.python, "utf-8", notebook.text.encode("utf-8")
        else:
            source = source or read_source(path)
            text, encoding, original = source.text, source.encoding, source.raw
    except OSError as error:
        print(f"{path}:1:1: error: {os_error_message(error)}", file=sys.stderr)
        return EXIT_ERROR
    except (UnicodeDecodeError, SyntaxError, NotebookError) as error:
        print(f"{path}:1:1: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        # A script whose training code lives in modules of its project converts with them.
        project = find_project(path, source) if notebook is None else None
        if project is not None:
            from autoaccel.convert.project_command import (
                finish_project,
                script_output,
            )  # builds on this module

            name = str(script_output(project, output))
            result = convert_project(project, options, name)
            if facts is not None and needs_facts_in_project(result, project, options):
                given, ran = _run_facts(
                    project.script.path, project.script.source.text, facts, options
                )
                if given is not None:
                    result = convert_project(project, options, name, given)
                verify = _with_original(verify, ran)
            line = already_distributed(
                options, [s for f in result.files for s in f.conversion.log.skipped]
            )
            if line is not None:
                report_stream(output).write(nothing_to_do_report(str(path), line, report_format))
                return EXIT_OK
            return finish_project(
                project,
                result,
                options,
                write,
                output,
                check,
                report_format,
                allow_partial,
                force,
                verify,
                unproven,
            )
        # The launch commands of `--to ddp` name the script that will run.
        name = str(_file_output(output) or path)
        conversion = convert_source(text, options, name)
        # (a script that calls no `.step(` has no optimizer step for a run to find)
        if (
            facts is not None
            and notebook is None
            and ".step(" in text
            and needs_facts(conversion, options)
        ):
            given, ran = _run_facts(path, text, facts, options)
            if given is not None:
                conversion = convert_source(text, options, name, given)
            verify = _with_original(verify, ran)
        converted = notebook.with_python(conversion.converted) if notebook else conversion.converted
    except SourceError as error:
        where = f"{error.line}:{error.column}"
        if notebook is not None:
            where = str(notebook.cell_range(error.line, error.column, error.line, error.column))
        print(f"{path}:{where}: {error.message}", file=sys.stderr)
        return EXIT_ERROR
    except ConversionError as error:
        print(f"{error.path or path}: {error}{_details_saved(error.details)}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as error:  # a module of the project
        print(f"{error.filename or path}:1:1: error: {os_error_message(error)}", file=sys.stderr)
        return EXIT_ERROR
    except NotebookError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except RecursionError:
        print(f"{path}: error: {TOO_DEEP}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:  # noqa: BLE001 - a bug in a step: one line, never a traceback
        first_line = (str(error).splitlines() or [""])[0]
        details = _details_saved(traceback.format_exc())
        print(
            f"{path}: internal error: {type(error).__name__}: {first_line}{details}",
            file=sys.stderr,
        )
        return EXIT_ERROR

    line = already_distributed(options, conversion.log.skipped)
    if line is not None:
        report_stream(output).write(nothing_to_do_report(str(path), line, report_format))
        return EXIT_OK  # and nothing written
    ahead = proof_ahead(verify, write, output)
    wrong = refusals(conversion.log.skipped, ahead)
    if wrong and not allow_partial:
        # refused: nothing is written, so there is nothing to run
        refused = without_launch(_readable(conversion, notebook))
        _print_report(refused, str(path), report_format, False, report_stream(output))
        print_not_applied(path, wrong, "error")
        print_refused(path, options)
        return EXIT_CHANGED
    writes = [_Write(output, converted, encoding)] if output is not None else []
    if write and conversion.changed:
        writes.append(_Write(path, converted, encoding, original))
    if _file_output(output) is not None or write:
        folder = (_file_output(output) or path).parent
        launchers = launcher_writes(folder, conversion.log.extra_files, force)
        if launchers is None:
            return EXIT_ERROR
        writes += launchers
    proof = Proof(not_run=unproven) if unproven else None
    if verify is not None:  # once nothing else stops the writes
        proof = verified(path, write_one(path, conversion.converted), verify, [])
        if proof is None:
            return EXIT_CHANGED
    writing = write or output is not None
    report = report_stream(output)
    _print_report(_readable(conversion, notebook), str(path), report_format, writing, report, proof)
    print_not_applied(path, wrong, "warning")
    print_not_applied(path, left_to_proof(conversion.log.skipped, ahead), "note")
    for item in writes:
        try:
            if item.path == STDOUT:
                sys.stdout.write(item.text)
            else:
                write_atomic(item.path, item.text, item.encoding, item.original)
        except OSError as error:
            print(f"{item.path}: error: not written: {os_error_message(error)}", file=sys.stderr)
            return EXIT_ERROR
    if check and conversion.changed:
        return EXIT_CHANGED
    return EXIT_OK


# The refusal of the wrap and shard steps that facts from a run can answer.
NO_TRAINED_MODEL = "no trained model was recognised"


def needs_facts(conversion: Conversion, options: ConvertOptions) -> bool:
    """Whether a short run can answer what the static conversion refused: which model
    trains (ddp, fsdp: the conversion refused for want of one), whether an input of a
    step is batch-first (dp: a step left alone for that reason alone)."""
    if options.target == "dp":
        return any(RUN_CAN_TELL in s.reason for s in conversion.log.skipped)
    return options.target in MULTI_PROCESS and any(
        s.wrong and NO_TRAINED_MODEL in s.reason for s in conversion.log.skipped
    )


def needs_facts_in_project(
    result: ProjectConversion, project: Project, options: ConvertOptions
) -> bool:
    """`needs_facts` for a project: a file with a refusal a run can answer, and an
    optimizer step somewhere in the project (`mylib.train_step()` steps for `train.py`)."""
    if not any(needs_facts(f.conversion, options) for f in result.files):
        return False
    texts = [f.source.text for f in project.files] + [m.tree.code for m in project.context]
    return any(".step(" in text for text in texts)


def _run_facts(
    path: Path, text: str, request: FactsRequest, options: ConvertOptions
) -> tuple[ConversionFacts | None, Run | None]:
    """Run the script `path` (whose text is `text`) for a few steps
    (`autoaccel.facts.collect_facts`), saying on stderr that it runs, why, and what the run
    established: its facts (None when it showed nothing: it failed before a training
    step, and the static conversion stands), and the harness's record of the run."""
    from autoaccel.facts import collect_facts
    from autoaccel.facts.resolve import ConversionFacts
    from autoaccel.facts.run import describe

    steps = f"{request.steps} training steps"
    why = (
        f"whether what the model gets or returns is batch-first is not clear from the code alone:"
        f" running the script for {steps} to record its shapes"
        if options.target == "dp"
        else f"no trained model found in the code alone: running the script for {steps} to see which one trains"
    )
    print(
        f"{path}: {why} (writes go to a scratch folder; --no-run skips this) ...",
        file=sys.stderr,
        flush=True,
    )
    ran = collect_facts(path, request)
    if ran.facts is None or not ran.facts.ran_steps:
        error = (ran.error.strip().splitlines() or ["it made no training step"])[0]
        print(
            f"{path}: the run showed nothing ({error}); the conversion stays static",
            file=sys.stderr,
        )
        return None, ran.run
    print(f"{path}: the run ({ran.seconds:.1f} s) {describe(ran.facts)}", file=sys.stderr)
    return ConversionFacts(ran.facts, path, text), ran.run


def _with_original(verify: VerifyRequest | None, ran: Run | None) -> VerifyRequest | None:
    """`verify` with the original's run for facts, when that ran the steps the proof
    runs (then the original does not run twice)."""
    if verify is None or ran is None:
        return verify
    exit_status, steps = ran.record.get("exit"), len(ran.record.get("losses") or [])
    same = exit_status == "ok" or (exit_status == "max-steps" and steps == verify.steps)
    return replace(verify, original=ran) if same else verify


def already_distributed(options: ConvertOptions, skipped: list[Skipped]) -> int | None:
    """The line where the script starts torch.distributed or wraps a model in DDP itself
    (nanoGPT), when that is all that stops `--to ddp`: then there is nothing to do. (A
    `torch.distributed.launch` or apex script is migrated instead; one whose migration
    fails is refused for what is left, and `--to fsdp` of a DDP script is refused.)"""
    wrong = [s for s in skipped if s.wrong]
    if options.target == "ddp" and len(wrong) == 1 and wrong[0].reason == ALREADY_DISTRIBUTED:
        return wrong[0].line
    return None


def verified(
    path: Path, write_conversion: WriteConversion, request: VerifyRequest, import_roots: list[Path]
) -> Proof | None:
    """Prove the conversion (see `verify_ddp`) and print each check; None on a failure,
    said with what to do. The run in progress shows on a spinner on a terminal, and as a
    line when it starts in a log or pipe (as pip and pytest do), where a spinner shows nothing."""
    if sys.stderr.isatty():
        from rich.console import Console

        with Console(stderr=True).status("") as status:
            checks, log = verify_ddp(
                path,
                write_conversion,
                request,
                import_roots,
                lambda what: status.update(f"--verify: running the {what}"),
                request.original,
            )
    else:
        checks, log = verify_ddp(
            path,
            write_conversion,
            request,
            import_roots,
            lambda what: print(f"--verify: running the {what} ...", file=sys.stderr, flush=True),
            request.original,
        )
    for check in checks:
        print(check.line, file=sys.stderr)
    if all(check.passed for check in checks):
        return Proof(tuple(checks))
    if log:
        print(log[-3000:], file=sys.stderr)
    if checks[0].name == ORIGINAL_RUNS:
        print(
            f"{path}: error: the original script fails here ({checks[0].detail}), so the"
            " conversion cannot be proven; nothing written. Give the script's arguments after"
            " `--` (`autoaccel convert SCRIPT --to ... --write -- ARGS`) and run it where its"
            " data is, or add --no-verify to write the conversion unproven",
            file=sys.stderr,
        )
    else:
        print(f"{path}: error: --verify failed (see above); nothing written", file=sys.stderr)
    return None


def proof_ahead(verify: VerifyRequest | None, write: bool, output: Path | None) -> bool:
    """Whether a proof runs before the result is written: it will (`verify`), or the
    command only previews, and writing it would run one."""
    return verify is not None or (not write and output is None)


def print_not_applied(path: Path, items: list[Skipped], level: str) -> None:
    for item in items:
        where = f"{path}:{item.line}:1" if item.line else str(path)
        print(f"{where}: {level}: {item.what} not applied: {item.reason}", file=sys.stderr)


def print_refused(path: Path, options: ConvertOptions) -> None:
    why = (
        "no DataParallel was added" if options.target == "dp"
        else "the result would not train like the original"
    )  # fmt: skip
    print(
        f"{path}: error: --to {options.target} refused: {why} (see above); nothing written."
        " `--allow-partial` writes it anyway.",
        file=sys.stderr,
    )


def launcher_writes(folder: Path, files: dict[str, str], force: bool) -> list[_Write] | None:
    """The launcher files (`train.sbatch`, ...) to write into `folder`, those already
    there as they are left out; None (each named) when one exists with other contents
    and not `force`: then nothing may be written."""
    launchers = [_Write(folder / name, text) for name, text in files.items()]
    clashing = [item for item in launchers if item.path.exists() and not _written(item)]
    if clashing and not force:
        for item in clashing:
            print(
                f"{item.path}: error: exists with other contents; not replaced, and"
                " nothing written (--force replaces it)",
                file=sys.stderr,
            )
        return None
    return [item for item in launchers if not _written(item)]


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


@dataclass(frozen=True)
class _Write:
    path: Path
    text: str
    encoding: str = "utf-8"
    original: bytes | None = None  # what the file held when it was read


def _written(item: _Write) -> bool:
    """Whether the file at `item.path` holds `item.text` already."""
    try:
        return read_bytes(item.path) == item.text.encode(item.encoding)
    except OSError:
        return False


def _readable(conversion: Conversion, notebook: Notebook | None) -> Conversion:
    """For a notebook, the conversion of its cells shown as a percent script
    (`# %% [cell N]` headers, magics as written) so that the diff reads like the notebook."""
    if notebook is None:
        return conversion
    return Conversion(
        notebook.render(conversion.original), notebook.render(conversion.converted), conversion.log
    )


def _print_report(
    conversion: Conversion,
    path: str,
    report_format: str,
    writing: bool,
    stream: TextIO,
    proof: Proof | None = None,
) -> None:
    if report_format == "markdown":
        stream.write(markdown_report(conversion, path))
    elif report_format == "json":
        stream.write(json_report(conversion, path, proof))
    elif not writing or conversion.log.changes or conversion.log.skipped:
        stream.write(text_report(conversion, path, use_colour(stream), proof))
