"""The end of `autoaccel convert`: what to report, write and exit with, built as data by
`finish`, then done by `apply`. A script converts as a project of one module, a notebook
as one module whose code cells are written back into it.

`-o FILE` names the converted script when only the script changes; when modules of its
project change too, `-o DIR` writes a copy of the project that runs from DIR: the script
and every module it imports from the project, at their places relative to one another
(converted or as they are), with the packages' `__init__.py` files.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from autoaccel.convert.log import Skipped, left_to_proof, refusals
from autoaccel.convert.pipeline import Conversion
from autoaccel.convert.project_conversion import Project
from autoaccel.convert.report import (
    json_object,
    json_report,
    launch_report,
    markdown_report,
    nothing_to_do_report,
    proof_object,
    proof_report,
    text_report,
    without_launch,
)
from autoaccel.convert.transforms.distributed.init_process_group import ALREADY_DISTRIBUTED
from autoaccel.convert.verify import Proof
from autoaccel.diff import use_colour
from autoaccel.fileio import SourceFile, os_error_message, read_bytes, write_all_atomic
from autoaccel.notebook import Notebook

EXIT_OK, EXIT_CHANGED, EXIT_ERROR = 0, 1, 2  # EXIT_CHANGED also: refused
STDOUT = Path("-")  # `-o -` prints the result


@dataclass(frozen=True)
class Module:
    """A converted file: the script, a module of its project, or a notebook's code cells."""

    path: Path
    source: SourceFile  # as read: the result keeps its encoding, a write checks its bytes
    conversion: Conversion  # as reported
    text: str  # the converted file, as written


def notebook_module(path: Path, notebook: Notebook, conversion: Conversion) -> Module:
    """The conversion of a notebook's code cells, reported as a percent script (`# %% [cell
    N]` headers, magics as written) so that the diff reads like the notebook, and written
    back into the notebook (raises `NotebookError` when the rewrite moved a cell boundary)."""
    render = notebook.render
    shown = Conversion(render(conversion.original), render(conversion.converted), conversion.log)
    source = SourceFile(notebook.text, "utf-8", notebook.text.encode("utf-8"))
    return Module(path, source, shown, notebook.with_python(conversion.converted))


@dataclass(frozen=True)
class FinishRequest:
    """What the command line asks of a conversion once it is done."""

    target: str
    write: bool = False
    output: Path | None = None  # `-o`: a file, a folder (a copy of the project) or STDOUT
    check: bool = False
    report_format: str = "text"
    allow_partial: bool = False
    force: bool = False
    proof: bool = False  # a proof runs before anything is written (`--verify`)

    @property
    def proof_ahead(self) -> bool:
        """Whether a proof runs before the result is written: it will, or the command only
        previews, and writing it would run one."""
        return self.proof or (not self.write and self.output is None)


@dataclass(frozen=True)
class FileWrite:
    """A file to write, all or none with the others of its plan."""

    path: Path  # STDOUT: printed
    text: str
    encoding: str = "utf-8"
    original: bytes | None = None  # what the file held when it was read


@dataclass(frozen=True)
class Report:
    """What the report shows: each file's conversion (the script's first), or that there
    is nothing to do (at the line where the script is distributed already)."""

    modules: list[Module]
    report_format: str
    writing: bool
    whole_project: bool  # a project's report: json of every file, launch commands last
    to_stderr: bool  # stdout carries the converted code
    nothing_to_do: int | None = None


@dataclass(frozen=True)
class WritePlan:
    """What finishing a conversion does: print `report` and `messages` (on stderr), then
    write every file of `writes` or none (making `folders` first), and exit with
    `exit_code`. `decided`: nothing to do, refused, or stopped by an error: no proof runs."""

    report: Report | None
    messages: list[str] = field(default_factory=list)
    writes: list[FileWrite] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    exit_code: int = EXIT_OK
    decided: bool = False


def finish(
    modules: list[Module], request: FinishRequest, project: Project | None = None
) -> WritePlan:
    """The plan of a conversion of `modules` (the script first; `project`: the project they
    belong to, None for one file alone): nothing is written when a file would train wrongly
    (unless `allow_partial`), `-o` cannot hold the result, or a launcher file exists with
    other contents (unless `force`). Reads the files it may replace; writes nothing."""
    report = Report(
        modules, request.report_format, False, project is not None, request.output == STDOUT
    )
    line = _already_distributed(
        request.target, [s for m in modules for s in m.conversion.log.skipped]
    )
    if line is not None:
        return WritePlan(replace(report, nothing_to_do=line), decided=True)
    ahead = request.proof_ahead
    if not request.allow_partial and any(
        refusals(m.conversion.log.skipped, ahead) for m in modules
    ):
        # nothing is written, so there is nothing to run
        shown = [replace(m, conversion=without_launch(m.conversion)) for m in modules]
        messages = _not_applied(modules, ahead, "error") + [
            _refused(modules[0].path, request.target)
        ]
        return WritePlan(
            replace(report, modules=shown), messages, exit_code=EXIT_CHANGED, decided=True
        )
    writes, errors = _writes(modules, request, project)
    if errors:
        return WritePlan(None, errors, exit_code=EXIT_ERROR, decided=True)
    changed = any(m.conversion.changed for m in modules)
    copy = _copied(project, request.output)
    return WritePlan(
        replace(report, writing=request.write or request.output is not None),
        _not_applied(modules, ahead, "warning"),
        writes,
        sorted({item.path.parent for item in writes}) if copy else [],
        EXIT_CHANGED if request.check and changed else EXIT_OK,
    )


def apply(plan: WritePlan, proof: Proof | None = None) -> int:
    """Print the report (with what `proof` showed) and the messages, write the files (all
    or none), print what goes to stdout; the exit code."""
    if plan.report is not None:
        stream = sys.stderr if plan.report.to_stderr else sys.stdout
        stream.write(report_text(plan.report, proof, use_colour(stream)))
    for message in plan.messages:
        print(message, file=sys.stderr)
    files = [item for item in plan.writes if item.path != STDOUT]
    try:
        write_files(files, plan.folders)
    except OSError as error:
        where = getattr(error, "path", None) or files[0].path
        what = "not" if len(files) == 1 else "nothing"
        print(f"{where}: error: {what} written: {os_error_message(error)}", file=sys.stderr)
        return EXIT_ERROR
    for item in plan.writes:
        if item.path == STDOUT:
            sys.stdout.write(item.text)
    return plan.exit_code


def write_files(writes: list[FileWrite], folders: Iterable[Path] = ()) -> None:
    """Make `folders`, then write every file or none (see `write_all_atomic`)."""
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    write_all_atomic([(item.path, item.text, item.encoding, item.original) for item in writes])


def _already_distributed(target: str, skipped: list[Skipped]) -> int | None:
    """The line where the script starts torch.distributed or wraps a model in DDP itself
    (nanoGPT), when that is all that stops `--to ddp`: then there is nothing to do. (A
    `torch.distributed.launch` or apex script is migrated instead; one whose migration
    fails is refused for what is left, and `--to fsdp` of a DDP script is refused.)"""
    wrong = [s for s in skipped if s.wrong]
    if target == "ddp" and len(wrong) == 1 and wrong[0].reason == ALREADY_DISTRIBUTED:
        return wrong[0].line
    return None


def _not_applied(modules: list[Module], proof_ahead: bool, level: str) -> list[str]:
    """The rewrites each file lacks to train like the original, with its lines; as notes,
    those a check of the proof ahead decides."""
    lines = []
    for module in modules:
        skipped = module.conversion.log.skipped
        lines += [_not_applied_line(module.path, s, level) for s in refusals(skipped, proof_ahead)]
        lines += [
            _not_applied_line(module.path, s, "note") for s in left_to_proof(skipped, proof_ahead)
        ]
    return lines


def _not_applied_line(path: Path, item: Skipped, level: str) -> str:
    where = f"{path}:{item.line}:1" if item.line else str(path)
    return f"{where}: {level}: {item.what} not applied: {item.reason}"


def _refused(path: Path, target: str) -> str:
    why = (
        "no DataParallel was added" if target == "dp"
        else "the result would not train like the original"
    )  # fmt: skip
    return (
        f"{path}: error: --to {target} refused: {why} (see above); nothing written."
        " `--allow-partial` writes it anyway."
    )


def _writes(
    modules: list[Module], request: FinishRequest, project: Project | None
) -> tuple[list[FileWrite], list[str]]:
    """The files to write: `-o` (the script, or a copy of the project), `--write` (each
    changed file in place), and the launcher files beside the script that runs; or none,
    and the errors that stop them."""
    script, output = modules[0], request.output
    changed = [m for m in modules if m.conversion.changed]
    copy = _copied(project, output)
    writes = []
    if copy is not None:
        writes += project_copy(*copy, modules)
    elif output is not None:
        if any(m is not script for m in changed):
            return [], [_too_many(script.path, output, changed)]
        writes.append(FileWrite(output, script.text, script.source.encoding))
    if request.write:
        writes += [FileWrite(m.path, m.text, m.source.encoding, m.source.raw) for m in changed]
    if (output is not None and output != STDOUT) or request.write:
        folder = script_output(script.path, output, project).parent
        launchers, clashing = _launchers(folder, script.conversion.log.extra_files, request.force)
        if clashing:
            return [], clashing
        writes += launchers
    return writes, []


def _too_many(script: Path, output: Path, changed: list[Module]) -> str:
    names = ", ".join(str(m.path) for m in changed)
    where, takes = (
        (script, "stdout takes the script only (convert the file itself)")
        if output == STDOUT
        else (output, "-o takes a folder for them (an existing one, or a new path without .py)")
    )
    return (
        f"{where}: error: the conversion changes {len(changed)} files ({names});"
        f" {takes}; nothing written"
    )


def _launchers(
    folder: Path, files: dict[str, str], force: bool
) -> tuple[list[FileWrite], list[str]]:
    """The launcher files (`train.sbatch`, ...) to write into `folder`, those already
    there as they are left out; and an error for each that exists with other contents
    (none with `force`): then nothing may be written."""
    launchers = [FileWrite(folder / name, text) for name, text in files.items()]
    clashing = [item for item in launchers if item.path.exists() and not _written(item)]
    errors = [
        f"{item.path}: error: exists with other contents; not replaced, and"
        " nothing written (--force replaces it)"
        for item in clashing
    ]
    return [item for item in launchers if not _written(item)], [] if force else errors


def _written(item: FileWrite) -> bool:
    """Whether the file at `item.path` holds `item.text` already."""
    try:
        return read_bytes(item.path) == item.text.encode(item.encoding)
    except OSError:
        return False


# -- the layout of a project's copy (`-o DIR`) ------------------------------------------------
def is_folder_output(output: Path) -> bool:
    """Whether `-o output` names a folder: one that exists, or a new path without `.py`
    (`-`, stdout, is none)."""
    if output == STDOUT:
        return False
    return output.is_dir() or (not output.exists() and output.suffix != ".py")


def _copied(project: Project | None, output: Path | None) -> tuple[Project, Path] | None:
    """The project and the folder when `-o output` writes a copy of the project (a file
    alone is never copied)."""
    if project is None or output is None or not is_folder_output(output):
        return None
    return project, output


def script_output(script: Path, output: Path | None, project: Project | None = None) -> Path:
    """Where the converted script goes (its launch commands name it)."""
    if output is None or output == STDOUT:
        return script
    copy = _copied(project, output)
    return output if copy is None else in_copy(*copy, script)


def in_copy(project: Project, folder: Path, path: Path) -> Path:
    """Where a file (or folder) of the project goes in a copy of it in `folder`: at its
    place relative to the folder that holds all the files of the project, and the
    packages they are in (a src layout's `vision_transformer/`: imported by its name)."""
    root = copy_root(project)
    resolved = path.resolve()
    return folder / resolved.relative_to(root) if resolved.is_relative_to(root) else folder


def copy_root(project: Project) -> Path:
    """The folder whose place `folder` takes in a copy of the project (see `in_copy`)."""
    root = Path(os.path.commonpath([p.resolve().parent for p in project.all_paths]))
    while (root / "__init__.py").is_file():
        root = root.parent
    return root


def link_the_rest(source: Path, copy: Path) -> None:
    """Link each entry of `source` that its copy `copy` lacks (data files, folders), and so
    in each folder both have: a module that reads a file next to itself
    (`os.path.dirname(__file__) + "/../meta/classes.txt"`) finds it in the copy too."""
    for entry in source.iterdir():
        if entry.name == "__pycache__" or entry.name.startswith("."):
            continue
        target = copy / entry.name
        if target.is_dir() and entry.is_dir() and not target.is_symlink():
            link_the_rest(entry, target)
        elif not target.exists() and not target.is_symlink():
            target.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())


def project_copy(project: Project, folder: Path, modules: list[Module]) -> list[FileWrite]:
    """The files of a copy of the project in `folder` that runs."""
    converted = {m.path.resolve(): m for m in modules}
    writes = []
    for path in project.all_paths:
        target = in_copy(project, folder, path)
        done = converted.get(path.resolve())
        if done is not None:
            writes.append(FileWrite(target, done.text, done.source.encoding))
        else:  # copied byte for byte: latin-1 maps each byte to one character and back
            writes.append(FileWrite(target, read_bytes(path).decode("latin-1"), "latin-1"))
    return writes


# -- the report --------------------------------------------------------------------------------
def report_text(report: Report, proof: Proof | None, colour: bool) -> str:
    """The report, with what `proof` showed (`colour`: the text diff in colour)."""
    if report.nothing_to_do is not None:
        path = str(report.modules[0].path)
        return nothing_to_do_report(path, report.nothing_to_do, report.report_format)
    if not report.whole_project:
        script = report.modules[0]
        return _file_report(script.conversion, str(script.path), report, colour, proof)
    return _project_report(report, proof, colour)


def _file_report(
    conversion: Conversion, path: str, report: Report, colour: bool, proof: Proof | None
) -> str:
    if report.report_format == "markdown":
        return markdown_report(conversion, path)
    if report.report_format == "json":
        return json_report(conversion, path, proof)
    if not report.writing or conversion.log.changes or conversion.log.skipped:
        return text_report(conversion, path, colour, proof)
    return ""


def _project_report(report: Report, proof: Proof | None, colour: bool) -> str:
    """The report of every file that changed (the script's always): its diff, changes
    and items not changed, with lines of that file; then what the proof showed."""
    script = report.modules[0]
    changed = any(m.conversion.changed for m in report.modules)
    shown = [
        m for m in report.modules if m is script or m.conversion.changed or m.conversion.log.skipped
    ]
    if report.report_format == "json":
        objects = [json_object(m.conversion, str(m.path)) for m in shown]
        found = {"path": objects[0]["path"], "changed": changed, "files": objects}
        if proof is not None:
            found["proof"] = proof_object(proof)
        return json.dumps(found, indent=2) + "\n"
    # each file without the launch commands, which end the report
    parts = [
        _file_report(without_launch(m.conversion), str(m.path), report, colour, None) for m in shown
    ]
    if report.report_format == "text" and (not report.writing or changed):
        parts.append(proof_report(proof))
    launch = launch_report(script.conversion, report.report_format == "markdown")
    if launch and (report.report_format == "markdown" or not report.writing or changed):
        parts.append(("\n" if report.report_format == "markdown" else "") + launch)
    return "".join(parts)
