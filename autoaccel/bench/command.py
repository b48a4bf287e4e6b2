"""`autoaccel bench`: convert a script, run the original and the conversion for the same
number of steps in separate processes, alternately (A B A B ...), and compare speed, memory
and loss curves.

The converted script is written under the same name into a temporary folder, with the
original's folder on its module search path, so that it imports the same sibling modules
(a path built from its own `__file__` points into the temporary folder). Every run starts
in the current directory with the same arguments, seed, hash seed and thread settings.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from autoaccel.bench.compare import SLOWER, default_tolerance, summarise
from autoaccel.bench.ddp_memory import ddp_peaks
from autoaccel.bench.report import print_result, write_report
from autoaccel.console import stdout_console
from autoaccel.convert.log import MULTI_PROCESS, ConvertOptions
from autoaccel.convert.pipeline import ConversionError, convert_source
from autoaccel.convert.verify import checks
from autoaccel.fileio import os_error_message, read_source, write_atomic
from autoaccel.run.runner import Run, run_script
from autoaccel.source import SourceError

EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


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
    repeats: int = 3,
    allow_slower: bool = False,
    verify: bool = False,
) -> int:
    """Bench `script` against its conversion; 1 when the loss curves diverge, the
    conversion crashes, it is slower beyond the spread of the runs (unless
    `allow_slower`) or, with `verify`, a check of `convert --verify` fails on the first
    runs; 2 when the original cannot run or be converted."""
    err = Console(stderr=True)
    if report is not None and report.exists() and not report.is_dir():
        err.print(
            f"{report}: error: --report names a folder to write into; this is a file", markup=False
        )
        return EXIT_ERROR
    converted = _converted(script, options, err)
    if converted is None:
        return EXIT_ERROR
    ranks = _ranks(options, nproc)
    threads = _threads(ranks)
    runs = _alternate(script, converted, script_args, steps, ranks, repeats, threads, err)
    if runs is None:
        return EXIT_ERROR
    originals, converteds = runs
    if tolerance is None:
        tolerance = default_tolerance(options)
    args = " ".join(shlex.quote(a) for a in script_args)
    result = {
        "script": str(script),
        "command": (
            f"{convert_options_text(options)} --steps {steps} --repeats {repeats}"
            + (f" -- {args}" if args else "")
        ),
        "options": asdict(options),
        "steps": steps,
        "threads": threads,
        **summarise(
            [run.record for run in originals],
            [run.record for run in converteds],
            options,
            warmup,
            tolerance,
        ),
    }
    crashed = any(run.failed for run in converteds)
    result["agree"] = result["agree"] and not crashed
    if verify:
        factor = (ranks or 1) if options.per_process_batch else 1  # the processes' batch, together
        found = checks(originals[0], converteds[0], batch_factor=factor)
        result["verify"] = [asdict(check) for check in found]
    if options.target == "fsdp" and not crashed:
        with err.status("one run of the --to ddp conversion, for its peak memory"):
            result["ddp_peak"] = ddp_peaks(script, script_args, options, steps, ranks, threads)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        print_result(result, stdout_console(), allow_slower)
    if report is not None:
        try:
            warnings = write_report(result, report)
        except OSError as error:
            err.print(
                f"{report}: error: report not written: {os_error_message(error)}", markup=False
            )
            return EXIT_ERROR
        for warning in warnings:
            err.print(f"warning: {warning}", markup=False)
        err.print(f"report written to {report}", markup=False)
    verified = all(check["passed"] for check in result.get("verify", []))
    if not result["agree"] or not verified or (result["speed"] == SLOWER and not allow_slower):
        return EXIT_FAILED
    return EXIT_OK


def _threads(ranks: int | None) -> str | None:
    """OMP_NUM_THREADS for both sides: yours, else for ddp the cores shared out over the
    ranks (torchrun would give each rank one thread while the original had them all)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return os.environ["OMP_NUM_THREADS"]
    if ranks is None:
        return None
    return str(max(1, (os.cpu_count() or 1) // ranks))


def _ranks(options: ConvertOptions, nproc: int | None) -> int | None:
    """Processes the conversion runs in: one per GPU (2 without) for `--to ddp` / `fsdp`."""
    if options.target not in MULTI_PROCESS:
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
        err.print(
            f"{script}: the conversion changes nothing; both runs use the same code", markup=False
        )
    return conversion.converted


def _alternate(
    script: Path,
    converted: str,
    args: list[str],
    steps: int,
    nproc: int | None,
    repeats: int,
    threads: str | None,
    err: Console,
) -> tuple[list[Run], list[Run]] | None:
    """Run the original and the conversion (one process per rank with `nproc`) in turn,
    `repeats` times each, so that a drift of the machine's speed touches both alike.
    Stops at the first failure; None when the original failed."""
    originals: list[Run] = []
    converteds: list[Run] = []
    env = {"OMP_NUM_THREADS": threads} if threads else {}
    with tempfile.TemporaryDirectory(prefix="autoaccel-bench-") as folder:
        copy = Path(folder) / "converted" / script.name
        copy.parent.mkdir()
        write_atomic(copy, converted)
        sides = (("original", script, None, originals), ("converted", copy, nproc, converteds))
        with err.status("") as status:
            for repeat in range(1, repeats + 1):
                for name, path, processes, done in sides:
                    label = f"run {repeat}/{repeats}, {name} script"
                    status.update(f"{label}: starting")
                    run = run_script(
                        path,
                        args,
                        steps,
                        Path(folder) / f"records-{name}-{repeat}",
                        processes,
                        import_from=[script.resolve().parent],
                        env=env,
                        on_step=lambda step: status.update(f"{label}: step {step}/{steps}"),
                    )
                    done.append(run)
                    if run.failed:
                        err.print(
                            f"{script}: the {name} script failed ({run.record['exit']})",
                            markup=False,
                        )
                        err.print(run.log[-3000:], markup=False, highlight=False)
                        return None if name == "original" else (originals, converteds)
    return originals, converteds
