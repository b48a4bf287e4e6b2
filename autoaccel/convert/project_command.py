"""`autoaccel convert` of a script whose training code lives in modules of its project:
report every file, then write all of them or none.

`-o FILE` names the converted script when only the script changes; when modules change
too, `-o DIR` writes a copy of the project that runs from DIR: the script and every
module it imports from the project, at their places relative to one another (converted
or as they are), with the packages' `__init__.py` files.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from autoaccel.analysis.project import project_roots
from autoaccel.convert.command import (
    EXIT_CHANGED,
    EXIT_ERROR,
    EXIT_OK,
    STDOUT,
    _print_report,
    _Write,
    launcher_writes,
    print_not_applied,
    print_refused,
    proof_ahead,
    report_stream,
    verified,
)
from autoaccel.convert.log import ConvertOptions, left_to_proof, refusals
from autoaccel.convert.project_conversion import Project, ProjectConversion
from autoaccel.convert.report import (
    json_object,
    launch_report,
    proof_object,
    proof_report,
    without_launch,
)
from autoaccel.convert.verify import Proof, VerifyRequest
from autoaccel.fileio import os_error_message, read_bytes, write_all_atomic


def is_folder_output(output: Path) -> bool:
    """Whether `-o output` names a folder: one that exists, or a new path without `.py`
    (`-`, stdout, is none)."""
    if output == STDOUT:
        return False
    return output.is_dir() or (not output.exists() and output.suffix != ".py")


def script_output(project: Project, output: Path | None) -> Path:
    """Where the converted script goes (its launch commands name it)."""
    if output is None or output == STDOUT:
        return project.script.path
    return _in_copy(project, project.script.path, output) if is_folder_output(output) else output


def _in_copy(project: Project, path: Path, folder: Path) -> Path:
    """Where a file (or folder) of the project goes in a copy of it in `folder`: at its
    place relative to the folder that holds all the files of the project."""
    root = Path(os.path.commonpath([p.resolve().parent for p in project.all_paths]))
    resolved = path.resolve()
    return folder / resolved.relative_to(root) if resolved.is_relative_to(root) else folder


def finish_project(
    project: Project,
    result: ProjectConversion,
    options: ConvertOptions,
    write: bool,
    output: Path | None,
    check: bool,
    report_format: str,
    allow_partial: bool,
    force: bool,
    verify: VerifyRequest | None = None,
    unproven: str = "",
) -> int:
    """Report `result`, then write it (`--write`: in place; `-o`: to `output`) unless a
    file would train wrongly, fails `verify`, `-o` cannot hold it, or a file cannot be
    written. The report lists the checks `verify` passed, or says `unproven`."""
    ahead = proof_ahead(verify, write, output)
    if not allow_partial and any(refusals(f.conversion.log.skipped, ahead) for f in result.files):
        # nothing is written, so there is nothing to run
        files = [replace(f, conversion=without_launch(f.conversion)) for f in result.files]
        _report(ProjectConversion(files), report_format, False, report_stream(output))
        _refusals(result, ahead, "error")
        print_refused(project.script.path, options)
        return EXIT_CHANGED
    changed = result.changed
    writes: list[_Write] = []
    if output is not None:
        if is_folder_output(output):
            writes += _project_copy(project, result, output)
        elif len(changed) > 1 or (changed and changed[0].file is not project.script):
            names = ", ".join(str(f.file.path) for f in changed)
            where, takes = (
                (project.script.path, "stdout takes the script only (convert the file itself)")
                if output == STDOUT
                else (
                    output,
                    "-o takes a folder for them (an existing one, or a new path without .py)",
                )
            )
            print(
                f"{where}: error: the conversion changes {len(changed)} files ({names});"
                f" {takes}; nothing written",
                file=sys.stderr,
            )
            return EXIT_ERROR
        else:
            script = result.files[0]
            writes.append(_Write(output, script.conversion.converted, script.file.source.encoding))
    if write:
        writes += [
            _Write(f.file.path, f.conversion.converted, f.file.source.encoding, f.file.source.raw)
            for f in changed
        ]
    if (output is not None and output != STDOUT) or write:
        folder = script_output(project, output).parent
        launchers = launcher_writes(folder, result.files[0].conversion.log.extra_files, force)
        if launchers is None:
            return EXIT_ERROR
        writes += launchers
    proof = Proof(not_run=unproven) if unproven else None
    if verify is not None:  # once nothing else stops the writes
        proof = _verified(project, result, verify)
        if proof is None:
            return EXIT_CHANGED
    _report(result, report_format, write or output is not None, report_stream(output), proof)
    _refusals(result, ahead, "warning")
    printed = [item for item in writes if item.path == STDOUT]
    writes = [item for item in writes if item.path != STDOUT]
    try:
        for folder in {item.path.parent for item in writes}:
            folder.mkdir(parents=True, exist_ok=True)
        write_all_atomic([(item.path, item.text, item.encoding, item.original) for item in writes])
    except OSError as error:
        where = getattr(error, "path", None) or output or project.script.path
        print(f"{where}: error: nothing written: {os_error_message(error)}", file=sys.stderr)
        return EXIT_ERROR
    for item in printed:
        sys.stdout.write(item.text)
    if check and changed:
        return EXIT_CHANGED
    return EXIT_OK


def _verified(project: Project, result: ProjectConversion, request: VerifyRequest) -> Proof | None:
    """`--verify` on a copy of the project with the converted files (what `-o DIR` writes)."""
    roots = project_roots(project.script.path)

    def write_copy(folder: Path) -> tuple[Path, list[Path]]:
        copies = _project_copy(project, result, folder)
        for item in copies:
            item.path.parent.mkdir(parents=True, exist_ok=True)
        write_all_atomic([(item.path, item.text, item.encoding, item.original) for item in copies])
        return script_output(project, folder), [_in_copy(project, root, folder) for root in roots]

    return verified(project.script.path, write_copy, request, roots)


def _refusals(result: ProjectConversion, proof_ahead: bool, level: str) -> None:
    """The rewrites each file lacks to train like the original, with its lines; as notes,
    those a check of the proof ahead decides."""
    for file in result.files:
        print_not_applied(file.file.path, refusals(file.conversion.log.skipped, proof_ahead), level)
        print_not_applied(
            file.file.path, left_to_proof(file.conversion.log.skipped, proof_ahead), "note"
        )


def _project_copy(project: Project, result: ProjectConversion, folder: Path) -> list[_Write]:
    """The files of a copy of the project in `folder` that runs."""
    converted = {f.file.path.resolve(): f for f in result.files}
    writes = []
    for path in project.all_paths:
        target = _in_copy(project, path, folder)
        done = converted.get(path.resolve())
        if done is not None:
            writes.append(_Write(target, done.conversion.converted, done.file.source.encoding))
        else:  # copied byte for byte: latin-1 maps each byte to one character and back
            writes.append(_Write(target, read_bytes(path).decode("latin-1"), "latin-1"))
    return writes


def _report(
    result: ProjectConversion,
    report_format: str,
    writing: bool,
    stream: TextIO,
    proof: Proof | None = None,
) -> None:
    """The report of every file that changed (the script's always): its diff, changes
    and items not changed, with lines of that file; then what the proof showed."""
    shown = [
        f
        for f in result.files
        if f is result.files[0] or f.conversion.changed or f.conversion.log.skipped
    ]
    if report_format == "json":
        objects = [json_object(f.conversion, str(f.file.path)) for f in shown]
        report = {"path": objects[0]["path"], "changed": bool(result.changed), "files": objects}
        if proof is not None:
            report["proof"] = proof_object(proof)
        stream.write(json.dumps(report, indent=2) + "\n")
        return
    for file in shown:  # each file without the launch commands, which end the report
        conversion = without_launch(file.conversion)
        _print_report(conversion, str(file.file.path), report_format, writing, stream)
    if report_format == "text" and (not writing or result.changed):
        stream.write(proof_report(proof))
    launch = launch_report(result.files[0].conversion, report_format == "markdown")
    if launch and (report_format == "markdown" or not writing or result.changed):
        stream.write(("\n" if report_format == "markdown" else "") + launch)
