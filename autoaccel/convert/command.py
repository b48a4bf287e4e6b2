"""`autoaccel convert`: read, convert, check, then print, write or compare."""

from __future__ import annotations

import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from autoaccel.analysis.project import project_roots
from autoaccel.convert.finish import (
    EXIT_CHANGED,
    EXIT_ERROR,
    STDOUT,
    FinishRequest,
    Module,
    apply,
    copy_root,
    finish,
    in_copy,
    link_the_rest,
    notebook_module,
    project_copy,
    script_output,
    write_files,
)
from autoaccel.convert.log import MULTI_PROCESS, ConvertOptions
from autoaccel.convert.pipeline import Conversion, ConversionError, convert_source
from autoaccel.convert.project_conversion import (
    Project,
    ProjectConversion,
    convert_project,
    find_project,
)
from autoaccel.convert.transforms.data_parallel.step_segments import RUN_CAN_TELL
from autoaccel.convert.transforms.distributed.shard_train_loader import LOADERS_RUN_CAN_TELL
from autoaccel.convert.verify import (
    ORIGINAL_RUNS,
    Proof,
    VerifyRequest,
    WriteConversion,
    verify_ddp,
    write_one,
)
from autoaccel.fileio import (
    MAX_SOURCE_BYTES,
    FileRefused,
    SourceFile,
    mebibytes,
    os_error_message,
    read_source,
)
from autoaccel.notebook import Notebook, NotebookError, is_notebook, read_notebook
from autoaccel.run.facts import FactsRequest, collect_facts, describe
from autoaccel.source import TOO_DEEP, SourceError

if TYPE_CHECKING:
    from autoaccel.facts.resolve import ConversionFacts
    from autoaccel.run.runner import Run

STDIN = STDOUT  # `convert -` reads the script from stdin
Converted = TypeVar("Converted", Conversion, ProjectConversion)


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
    try:
        read = _read(path, options.target, from_stdin)
    except OSError as error:
        print(f"{path}:1:1: error: {os_error_message(error)}", file=sys.stderr)
        return EXIT_ERROR
    except (UnicodeDecodeError, SyntaxError, NotebookError) as error:
        print(f"{path}:1:1: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    request = FinishRequest(
        options.target, write, output, check, report_format, allow_partial, force,
        proof=verify is not None,
    )  # fmt: skip
    return _convert_and_finish(path, read, options, request, facts, verify, unproven)


def _convert_and_finish(
    path: Path,
    read: SourceFile | Notebook,
    options: ConvertOptions,
    request: FinishRequest,
    facts: FactsRequest | None,
    verify: VerifyRequest | None,
    unproven: str,
) -> int:
    """Convert what was read, prove it where `verify` asks (once nothing else stops the
    writes), then report and write it; each error said in one line (exit 2)."""
    try:
        modules, project, verify = _convert(path, read, options, request.output, facts, verify)
        plan = finish(modules, request, project)
        proof = Proof(not_run=unproven) if unproven else None
        if verify is not None and not plan.decided:
            proof = _prove(modules, project, verify)
            if proof is None:
                return EXIT_CHANGED
        return apply(plan, proof)
    except SourceError as error:
        where = f"{error.line}:{error.column}"
        if isinstance(read, Notebook):
            where = str(read.cell_range(error.line, error.column, error.line, error.column))
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


def _read(path: Path, target: str, from_stdin: bool) -> SourceFile | Notebook:
    """The script at `path` (or on stdin), or the notebook."""
    source = _read_stdin() if from_stdin else None
    if not is_notebook(path):
        return source or read_source(path)
    if target != "single":
        raise NotebookError("notebooks convert with `--to single` only")
    return Notebook(source.text) if source else read_notebook(path)


def _convert(
    path: Path,
    read: SourceFile | Notebook,
    options: ConvertOptions,
    output: Path | None,
    facts: FactsRequest | None,
    verify: VerifyRequest | None,
) -> tuple[list[Module], Project | None, VerifyRequest | None]:
    """The converted modules (the script first), the project they belong to (None for a
    file alone), and `verify` (see `_with_facts`). The launch commands of `--to ddp` name
    the script that will run."""
    if isinstance(read, Notebook):
        conversion = convert_source(read.python, options, str(script_output(path, output)))
        return [notebook_module(path, read, conversion)], None, verify
    # A script whose training code lives in modules of its project converts with them.
    project = find_project(path, read)
    if project is None:
        name, text = str(script_output(path, output)), read.text
        conversion, verify = _with_facts(
            lambda given: convert_source(text, options, name, given),
            # (a script that calls no `.step(` has no optimizer step for a run to find)
            lambda done: ".step(" in text and needs_facts(done, options),
            path,
            text,
            facts,
            options,
            verify,
        )
        return [Module(path, read, conversion, conversion.converted)], None, verify
    name = str(script_output(path, output, project))
    result, verify = _with_facts(
        lambda given: convert_project(project, options, name, given),
        lambda done: needs_facts_in_project(done, project, options),
        path,
        read.text,
        facts,
        options,
        verify,
    )
    files = result.files
    return (
        [Module(f.file.path, f.file.source, f.conversion, f.conversion.converted) for f in files],
        project,
        verify,
    )


def _prove(modules: list[Module], project: Project | None, request: VerifyRequest) -> Proof | None:
    """`verified` of the converted script beside the original's modules, or of a copy of
    its project with the converted files (what `-o DIR` writes)."""
    script = modules[0].path
    request = replace(request, batch_rounds=any(m.conversion.log.batch_rounds for m in modules))
    if project is None:
        return verified(script, write_one(script, modules[0].text), request, [])
    roots = project_roots(script)

    def write_copy(folder: Path) -> tuple[Path, list[Path]]:
        copies = project_copy(project, folder, modules)
        write_files(copies, {item.path.parent for item in copies})
        link_the_rest(copy_root(project), folder)  # the data files the modules read
        return script_output(script, folder, project), [
            in_copy(project, folder, root) for root in roots
        ]

    return verified(script, write_copy, request, roots)


# The refusal of the wrap and shard steps that facts from a run can answer.
NO_TRAINED_MODEL = "no trained model was recognised"


def needs_facts(conversion: Conversion, options: ConvertOptions) -> bool:
    """Whether a short run can answer what the static conversion refused: which model
    trains (ddp, fsdp: the conversion refused for want of one), whether an input of a
    step is batch-first (dp: a step left alone for that reason alone)."""
    if options.target == "dp":
        return any(RUN_CAN_TELL in s.reason for s in conversion.log.skipped)
    return options.target in MULTI_PROCESS and any(
        s.wrong and (NO_TRAINED_MODEL in s.reason or LOADERS_RUN_CAN_TELL in s.reason)
        for s in conversion.log.skipped
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
    from autoaccel.facts.resolve import ConversionFacts

    steps = f"{request.steps} training steps"
    why = (
        f"whether what the model gets or returns is batch-first is not clear from the code alone:"
        f" running the script for {steps} to record its shapes"
        if options.target == "dp"
        else f"the code alone does not show which model or DataLoader trains: running the script for {steps} to see"
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


def _with_facts(
    convert: Callable[[ConversionFacts | None], Converted],
    needs: Callable[[Converted], bool],
    path: Path,
    text: str,
    request: FactsRequest | None,
    options: ConvertOptions,
    verify: VerifyRequest | None,
) -> tuple[Converted, VerifyRequest | None]:
    """`convert` statically; where that `needs` a run (see `needs_facts`) and `request`
    allows one, again with the facts of a run of the script `path` (whose text is `text`).
    With `verify`, that run as the original's run of the proof (see `_with_original`)."""
    converted = convert(None)
    if request is None or not needs(converted):
        return converted, verify
    given, ran = _run_facts(path, text, request, options)
    return (converted if given is None else convert(given)), _with_original(verify, ran)


def _with_original(verify: VerifyRequest | None, ran: Run | None) -> VerifyRequest | None:
    """`verify` with the original's run for facts, when that ran the steps the proof
    runs (then the original does not run twice)."""
    if verify is None or ran is None:
        return verify
    exit_status, steps = ran.record.get("exit"), len(ran.record.get("losses") or [])
    same = exit_status == "ok" or (exit_status == "max-steps" and steps == verify.steps)
    return replace(verify, original=ran) if same else verify


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
