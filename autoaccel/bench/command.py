"""`autoaccel bench`: convert a script, run the original and the conversion for the same
number of steps in separate processes, and compare speed, memory and loss curves.

The converted script is written under the same name into a temporary folder, with the
original's folder on its module search path, so that it imports the same sibling modules
(a path built from its own `__file__` points into the temporary folder). Both runs start
in the current directory with the same arguments, seed and hash seed.
"""

from __future__ import annotations

import json
from dataclasses import asdict
import shlex
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from autoaccel.bench.compare import default_tolerance, summarise
from autoaccel.bench.report import print_result, write_report
from autoaccel.bench.runner import Run, run_script
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import ConversionError, convert_source
from autoaccel.fileio import os_error_message, read_source, write_atomic
from autoaccel.lint.engine import SourceError

EXIT_OK, EXIT_DIVERGED, EXIT_ERROR = 0, 1, 2


def convert_options_text(options: ConvertOptions) -> str:
    """The conversion's options as `autoaccel convert` takes them."""
    words = [f"--to {options.target}", f"--amp {options.amp}"]
    words += ["--compile"] * options.compile + ["--channels-last"] * options.channels_last
    return " ".join(words)


def run_bench(
    script: Path,
    script_args: list[str],
    options: ConvertOptions,
    steps: int = 50,
    warmup: int = 5,
    tolerance: float | None = None,
    report: Path | None = None,
    as_json: bool = False,
    nproc: int | None = None,
) -> int:
    """Bench `script` against its conversion; 1 when the loss curves diverge."""
    err = Console(stderr=True)
    if report is not None and report.exists() and not report.is_dir():
        err.print(f"{report}: error: --report names a folder to write into; this is a file", markup=False)
        return EXIT_ERROR
    converted = _converted(script, options, err)
    if converted is None:
        return EXIT_ERROR
    runs = _run_both(script, converted, script_args, steps, _ranks(options, nproc), err)
    if runs["original"].failed:
        return EXIT_ERROR
    if tolerance is None:
        tolerance = default_tolerance(options)
    args = " ".join(shlex.quote(a) for a in script_args)
    result = {
        "script": str(script),
        "command": f"{convert_options_text(options)} --steps {steps}" + (f" -- {args}" if args else ""),
        "options": asdict(options),
        "steps": steps,
        **summarise(runs["original"].record, runs["converted"].record, options, warmup, tolerance),
    }
    result["agree"] = result["agree"] and not runs["converted"].failed
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        print_result(result, Console())
    if report is not None:
        try:
            warnings = write_report(result, report)
        except OSError as error:
            err.print(f"{report}: error: report not written: {os_error_message(error)}", markup=False)
            return EXIT_ERROR
        for warning in warnings:
            err.print(f"warning: {warning}", markup=False)
        err.print(f"report written to {report}", markup=False)
    return EXIT_OK if result["agree"] else EXIT_DIVERGED


def _ranks(options: ConvertOptions, nproc: int | None) -> int | None:
    """Processes the conversion runs in: one per GPU (2 without) for `--to ddp`."""
    if options.target != "ddp":
        return None
    if nproc:
        return nproc
    import torch

    return torch.cuda.device_count() or 2


def _converted(script: Path, options: ConvertOptions, err: Console) -> str | None:
    """The converted source, or None (with the reason printed) when there is none."""
    try:
        conversion = convert_source(read_source(script).text, options, str(script))
    except OSError as error:
        err.print(f"{script}: error: {os_error_message(error)}", markup=False)
        return None
    except UnicodeDecodeError as error:
        err.print(f"{script}: error: {error}", markup=False)
        return None
    except (SourceError, ConversionError, RecursionError) as error:
        err.print(f"{script}: cannot convert: {error}", markup=False)
        return None
    if not conversion.changed:
        err.print(f"{script}: the conversion changes nothing; both runs use the same code", markup=False)
    return conversion.converted


def _run_both(
    script: Path, converted: str, args: list[str], steps: int, nproc: int | None, err: Console
) -> dict[str, Run]:
    """Run the original, then the conversion (one process per rank with `nproc`)."""
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="autoaccel-bench-") as folder:
        copy = Path(folder) / "converted" / script.name
        copy.parent.mkdir()
        write_atomic(copy, converted)
        for name, path, processes in (("original", script, None), ("converted", copy, nproc)):
            with err.status(f"running the {name} script for {steps} steps"):
                runs[name] = run_script(
                    path, args, steps, Path(folder) / f"records-{name}", processes,
                    import_from=script.resolve().parent,
                )
    for name, run in runs.items():
        if run.failed:
            err.print(f"{script}: the {name} script failed ({run.record['exit']})", markup=False)
            err.print(run.log[-3000:], markup=False, highlight=False)
    return runs
