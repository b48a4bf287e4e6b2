"""`autoaccel tune`: run the measuring process, show its progress, then the table, the
JSON or the rewrite, and compare the measurement with what `autoaccel convert` writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from autoaccel.console import stdout_console
from autoaccel.run.runner import python_command
from autoaccel.tune.sweep import LoaderSetting, Measurement, clearly_faster

EXIT_OK, EXIT_ERROR = 0, 2
_DEFAULTS = LoaderSetting()


def run_tune(
    script: Path,
    script_args: list[str],
    batches: int = 50,
    repeats: int = 3,
    max_workers: int | None = None,
    write: bool = False,
    as_json: bool = False,
) -> int:
    """Tune the DataLoaders of `script`; print a table (or JSON) and maybe rewrite it."""
    err = Console(stderr=True)
    if not script.is_file():
        err.print(f"error: {script}: no such file")
        return EXIT_ERROR
    with tempfile.TemporaryDirectory(prefix="autoaccel-tune-") as folder:
        events, log = Path(folder) / "events.jsonl", Path(folder) / "script.log"
        command = [*python_command(), "-m", "autoaccel.tune.measure", "--events", str(events)]
        command += ["--batches", str(batches), "--repeats", str(repeats)]
        command += ["--heuristic-workers", str(heuristic_workers())]
        if max_workers is not None:
            command += ["--max-workers", str(max_workers)]
        with log.open("wb") as output:
            process = subprocess.Popen(
                [*command, str(script), *script_args], stdout=output, stderr=subprocess.STDOUT
            )
            result = _follow(process, events, err)
        if result is None:
            tail = log.read_text(errors="replace")[-3000:]
            err.print(
                f"error: {script} stopped before its DataLoaders could be tuned", markup=False
            )
            err.print(tail, markup=False, highlight=False)
            return EXIT_ERROR
    for loader, choice in zip(result["loaders"], convert_choices(script, result["loaders"])):
        loader["convert"] = choice
    if as_json:
        sys.stdout.write(json.dumps({"script": str(script), **result}, indent=2) + "\n")
    else:
        print_tables(script, result, stdout_console())
    if write:
        return _write(script, result["loaders"], err)
    return EXIT_OK


def _follow(process: subprocess.Popen, events: Path, err: Console) -> dict[str, Any] | None:
    """Show the measuring process's progress; return its result event (None if it failed)."""
    result = None
    offset = 0
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("starting the script", total=None)
        while True:
            finished = process.poll() is not None
            if events.exists():
                with events.open(encoding="utf-8") as stream:
                    stream.seek(offset)
                    lines = stream.readlines()
                    offset = stream.tell()
                for event in map(json.loads, lines):
                    if event["type"] == "plan":
                        total = sum(loader["planned"] for loader in event["loaders"])
                        progress.update(task, total=total, description="timing DataLoaders")
                    elif event["type"] == "measured":
                        progress.update(task, advance=1, description=_label(event["measurement"]))
                    elif event["type"] == "result":
                        result = event
            if finished:
                break
            time.sleep(0.1)
    return result


def _label(measurement: dict[str, Any]) -> str:
    setting = measurement["setting"]
    return f"num_workers={setting['num_workers']}"


def heuristic_workers() -> int:
    """The worker count ACC101's fix (and so `convert`) writes, as it evaluates here."""
    from autoaccel.rules.acc101_dataloader_without_workers import WORKERS

    # The fix's own expression, `min(8, os.cpu_count() or 1)`: one source of truth.
    return eval(WORKERS, {"__builtins__": {"min": min}, "os": os})  # noqa: S307 - our constant


def convert_choices(script: Path, loaders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What `convert` and `lint --fix` do to each loader's workers: `writes` the keywords
    of ACC101's fix (None when it leaves them) and `reason` why it leaves them, if it says."""
    from autoaccel.config import LintSettings
    from autoaccel.fileio import read_source
    from autoaccel.lint.engine import analyse
    from autoaccel.rules.acc101_dataloader_without_workers import WORKERS
    from autoaccel.source import SourceError

    try:
        analysis = analyse(
            read_source(script).text, LintSettings(select=("ACC101",)), str(script), script=script
        )
    except (OSError, UnicodeDecodeError, SourceError) as error:
        return [{"writes": None, "reason": f"not analysed: {error}"} for _ in loaders]
    fixed = {finding.line for finding in analysis.diagnostics}
    reasons = {note.line: note.reason for note in analysis.notes}
    return [
        (
            {"writes": {"num_workers": WORKERS, "persistent_workers": "True"}, "reason": None}
            if loader["line"] in fixed
            else {"writes": None, "reason": reasons.get(loader["line"])}
        )
        for loader in loaders
    ]


def print_tables(script: Path, result: dict[str, Any], console: Console) -> None:
    if not result["loaders"]:
        console.print(f"{script}: no DataLoader was created before training started", markup=False)
        return
    for loader in result["loaders"]:
        console.print(
            f"{script}:{loader['line']}  {loader['dataset']}, batch {loader['batch_size']}, "
            f"{loader['batches_per_epoch']} batches/epoch",
            markup=False,
            highlight=False,
        )
        console.print(_table(loader))
        console.print(_summary(loader), markup=False, highlight=False)


def _table(loader: dict[str, Any]) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    headers = (
        "workers",
        "pin",
        "persist",
        "prefetch",
        "batch/s",
        "range",
        "1st batch",
        "speed-up",
        "",
    )
    for header in headers:
        table.add_column(header, justify="right" if header else "left", no_wrap=True)
    current, heuristic = loader["results"][0], _heuristic(loader)
    for row in sorted(loader["results"], key=lambda r: -(r["batches_per_s"] or 0)):
        setting = row["setting"]
        marks = [
            mark
            for mark, hit in (
                ("best", row == loader["best"]),
                ("current", row is current),
                ("convert writes it", row is heuristic),
            )
            if hit
        ]
        spread = row["batches_per_s_range"]
        table.add_row(
            str(setting["num_workers"]),
            "yes" if setting["pin_memory"] else "no",
            "yes" if setting["persistent_workers"] else "no",
            str(setting["prefetch_factor"] or "default"),
            f"{row['batches_per_s']:.1f}" if row["batches_per_s"] else row["error"] or "-",
            f"{spread[0]:.1f}-{spread[1]:.1f}" if spread else "-",
            f"{row['first_batch_s'] * 1000:.0f} ms" if row["first_batch_s"] else "-",
            _ratio(row, current),
            ", ".join(marks),
            style="bold green" if row == loader["best"] else None,
        )
    return table


def _heuristic(loader: dict[str, Any]) -> dict[str, Any] | None:
    """The measured row of the setting `convert` writes, when it writes one."""
    if loader["convert"]["writes"] is None or loader["heuristic"] is None:
        return None
    found = [row for row in loader["results"] if row["setting"] == loader["heuristic"]]
    return found[0] if found else None


def _ratio(row: dict[str, Any], current: dict[str, Any]) -> str:
    if not row["batches_per_s"] or not current["batches_per_s"]:
        return "-"
    return f"{row['batches_per_s'] / current['batches_per_s']:.2f}x"


def _summary(loader: dict[str, Any]) -> str:
    lines = []
    if loader["unpicklable"]:
        lines.append(
            f"The dataset cannot be pickled ({loader['unpicklable']}): worker processes need a "
            "picklable dataset (always on macOS and Windows, which spawn them), so only "
            "num_workers=0 was measured."
        )
    if loader["same_site"] > 1:
        lines.append(f"This call built {loader['same_site']} loaders; the first one was tuned.")
    best, current = loader["best"], loader["results"][0]
    if best == current:
        lines.append("The current setting is the fastest measured; nothing to change.")
    else:
        lines.append(f"Best: {_changes(loader)} ({_ratio(best, current)} the current setting).")
    lines += _against_convert(loader)
    return "\n".join(lines) + "\n"


def _changes(loader: dict[str, Any]) -> str:
    changes = ", ".join(f"{k}={v}" for k, v in _keywords(loader).items() if v is not None)
    return changes or "the defaults"


def _against_convert(loader: dict[str, Any]) -> list[str]:
    """What `convert` writes for the loader's workers, and whether the measurement agrees."""
    choice = loader["convert"]
    if choice["writes"] is None:
        reason = f": {choice['reason']}" if choice["reason"] else ""
        return [f"convert and lint --fix leave this loader's num_workers as it is{reason}."]
    writes = ", ".join(f"{name}={value}" for name, value in choice["writes"].items())
    said = f"convert and lint --fix (ACC101) write {writes}, a heuristic"
    heuristic = _heuristic(loader)
    if heuristic is None or not heuristic["batches_per_s"]:
        why = heuristic["error"] if heuristic else "no workers were tried"
        return [f"{said}; not measured here ({why})."]
    said += (
        f": num_workers={heuristic['setting']['num_workers']} here, "
        f"{_ratio(heuristic, loader['results'][0])} the current setting."
    )
    best = loader["best"]
    if not clearly_faster(Measurement.from_dict(best), Measurement.from_dict(heuristic)):
        return [said, "The measurement agrees: no setting measured is clearly faster than it."]
    if best == loader["results"][0]:
        apply = (
            f"keep it: add `# noqa: ACC101` to line {loader['line']} so that convert and "
            "lint --fix leave it"
        )
    else:
        apply = (
            f"`autoaccel tune --write` writes {_changes(loader)} into the call (convert then "
            "keeps it: ACC101 leaves a loader with workers alone)"
        )
    return [
        said,
        f"The measurement disagrees: the best measured is {_ratio(best, heuristic)} the "
        f"heuristic, beyond the spread of the passes; {apply}.",
    ]


def _keywords(loader: dict[str, Any]) -> dict[str, str | None]:
    """The keywords that turn the current setting into the best one (None: remove it)."""
    best = LoaderSetting(**loader["best"]["setting"])
    current = LoaderSetting(**loader["current"])
    changes: dict[str, str | None] = {}
    for name, value in best.as_dict().items():
        if value == getattr(current, name):
            continue
        default = getattr(_DEFAULTS, name)
        removable = name in ("persistent_workers", "prefetch_factor") and value == default
        changes[name] = None if removable else repr(value)
    return changes


def _write(script: Path, loaders: list[dict[str, Any]], err: Console) -> int:
    from autoaccel.convert.pipeline import ConversionError
    from autoaccel.fileio import os_error_message, read_source, write_atomic
    from autoaccel.source import SourceError
    from autoaccel.tune.set_loader_arguments import set_loader_arguments

    wanted = {
        (loader["line"], loader["column"]): _keywords(loader)
        for loader in loaders
        if loader["line"] is not None and loader["best"] != loader["results"][0]
    }
    if not wanted:
        err.print(f"{script}: nothing to write", markup=False)
        return EXIT_OK
    try:
        source = read_source(script)
        rewrite = set_loader_arguments(source.text, wanted, str(script))
    except OSError as error:
        err.print(f"{script}: error: {os_error_message(error)}", markup=False)
        return EXIT_ERROR
    except (SourceError, ConversionError, UnicodeDecodeError) as error:
        err.print(f"{script}: {error}", markup=False)
        return EXIT_ERROR
    for change in rewrite.log.changes:
        err.print(f"{script}:{change.line}: {change.description}", markup=False)
    for skipped in rewrite.log.skipped:
        where = f"{script}:{skipped.line}" if skipped.line else str(script)
        err.print(f"{where}: not written: {skipped.what}: {skipped.reason}", markup=False)
    if rewrite.changed:
        try:
            write_atomic(script, rewrite.converted, source.encoding, source.raw)
        except OSError as error:
            err.print(f"{script}: error: not written: {os_error_message(error)}", markup=False)
            return EXIT_ERROR
    return EXIT_OK
