"""The conversion report: text for terminals, markdown for PR comments, json for tools."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from autoaccel.convert.launch import in_comment, shell_word
from autoaccel.convert.log import Change, Skipped
from autoaccel.convert.pipeline import Conversion
from autoaccel.convert.verify import PROCESSES, Proof
from autoaccel.diff import colourize, unified_diff
from autoaccel.markdown import code_block, inline_code
from autoaccel.notebook import is_notebook, rendered_cell_line

COLLAPSE_AFTER = 40  # diff lines; longer diffs fold into <details> in markdown


def _place(conversion: Conversion, path: str, line: int) -> str:
    """Where `line` of the original is, as lint names it: `line 60`, or in a notebook
    (whose conversion is shown as `Notebook.render` text) `cell 5:20`."""
    if is_notebook(Path(path)):
        cell, cell_line = rendered_cell_line(conversion.original, line)
        return f"cell {cell}:{cell_line}"
    return f"line {line}"


def _change_lines(conversion: Conversion, path: str) -> list[str]:
    return [
        f"{_place(conversion, path, c.line)}: {c.code} {c.description}"
        for c in sorted(conversion.log.changes, key=lambda c: c.line)
    ]


def _skipped_lines(conversion: Conversion, path: str) -> list[str]:
    return [
        (f"{_place(conversion, path, s.line)}: " if s.line else "")
        + f"{s.what} not applied: {s.reason}"
        for s in conversion.log.skipped
    ]


def _launch_lines(conversion: Conversion) -> list[str]:
    extra = [
        f"# --write / -o also writes {in_comment(shell_word(name))} beside the script"
        for name in sorted(conversion.log.extra_files)
    ]
    return [*conversion.log.launch, *extra]


def without_launch(conversion: Conversion) -> Conversion:
    """`conversion` without the commands that run its result and the launcher files
    they use: for a report of a result that is not written (or whose launch is told once)."""
    return replace(conversion, log=replace(conversion.log, launch=[], extra_files={}))


def launch_report(conversion: Conversion, markdown: bool) -> str:
    """How to run the result ("Run it"), empty when there is nothing to say."""
    launch = _launch_lines(conversion)
    if not launch:
        return ""
    if markdown:
        return "\n".join(["**Run it**", "", code_block("\n".join(launch), "sh")]) + "\n"
    return "Run it:\n" + "".join(f"  {line}\n" for line in launch)


def proof_report(proof: Proof | None) -> str:
    """What the proof showed (the checks it passed), or why it did not run; empty
    where there is none to speak of (`--to single`, `dp`)."""
    if proof is None:
        return ""
    if proof.not_run:
        return f"Not proven: {proof.not_run}\n"
    return f"Proven by a run on {PROCESSES} CPU processes:\n" + "".join(
        f"  {c.name}\n" for c in proof.checks
    )


def proof_object(proof: Proof) -> dict:
    """The json of the proof: the checks it passed, each with what it saw, or why none ran."""
    return {
        "proven": [{"check": c.name, "detail": c.detail} for c in proof.checks],
        "not_run": proof.not_run or None,
    }


def text_report(conversion: Conversion, path: str, colour: bool, proof: Proof | None = None) -> str:
    diff = unified_diff(conversion.original, conversion.converted, path)
    parts = [colourize(diff) if colour else diff]
    changes = _change_lines(conversion, path)
    parts.append(
        f"{path}: {len(changes)} change{'s' * (len(changes) != 1)}\n"
        + "".join(f"  {line}\n" for line in changes)
        if changes
        else f"{path}: already fast, nothing to change\n"
    )
    skipped = _skipped_lines(conversion, path)
    if skipped:
        parts.append("Not changed:\n" + "".join(f"  {line}\n" for line in skipped))
    parts.append(proof_report(proof))
    parts.append(launch_report(conversion, markdown=False))
    return "".join(parts)


def markdown_report(conversion: Conversion, path: str) -> str:
    diff = unified_diff(conversion.original, conversion.converted, path)
    lines = [f"### autoaccel convert: {inline_code(path)}", ""]
    changes = _change_lines(conversion, path)
    lines += [f"- {line}" for line in changes] or ["No changes: the script is already fast."]
    skipped = _skipped_lines(conversion, path)
    if skipped:
        lines += ["", "**Not changed**", ""] + [f"- {line}" for line in skipped]
    launch = launch_report(conversion, markdown=True)
    if launch:
        lines += ["", launch.rstrip("\n")]
    if diff:
        block = [code_block(diff.rstrip("\n"), "diff")]
        if diff.count("\n") > COLLAPSE_AFTER:
            block = ["<details><summary>Diff</summary>", ""] + block + ["", "</details>"]
        lines += [""] + block
    return "\n".join(lines) + "\n"


def json_object(conversion: Conversion, path: str, proof: Proof | None = None) -> dict:
    """The json report of one file, as a dict (`proof`: only where there is one to speak of)."""
    found = {
        "path": path,
        "changed": conversion.changed,
        "changes": [_json_entry(conversion, path, c) for c in conversion.log.changes],
        "skipped": [_json_entry(conversion, path, s) for s in conversion.log.skipped],
        "launch": conversion.log.launch,
        "extra_files": conversion.log.extra_files,
        "diff": unified_diff(conversion.original, conversion.converted, path),
    }
    return found if proof is None else {**found, "proof": proof_object(proof)}


def _json_entry(conversion: Conversion, path: str, entry: Change | Skipped) -> dict:
    """A change or skipped item; in a notebook its line is a line of cell `cell`, as in
    lint's json."""
    fields = dict(entry.__dict__)
    if entry.line is not None and is_notebook(Path(path)):
        fields["cell"], fields["line"] = rendered_cell_line(conversion.original, entry.line)
    return fields


def json_report(conversion: Conversion, path: str, proof: Proof | None = None) -> str:
    return json.dumps(json_object(conversion, path, proof), indent=2) + "\n"


ALREADY_DISTRIBUTED = "the script is already distributed"


def nothing_to_do_report(path: str, line: int, report_format: str) -> str:
    """What `--to ddp` says of a script that sets up torch.distributed itself (at `line`)."""
    if report_format == "markdown":
        heading = f"### autoaccel convert: {inline_code(path)}"
        return f"{heading}\n\nNothing to do: {ALREADY_DISTRIBUTED} (line {line}).\n"
    if report_format == "json":
        found = {"path": path, "changed": False, "nothing_to_do": ALREADY_DISTRIBUTED, "line": line}
        return json.dumps(found, indent=2) + "\n"
    return f"{path}: nothing to do: {ALREADY_DISTRIBUTED} (line {line})\n"
