"""Run a script under `autoaccel.run.harness` in its own process (or one per rank under
`torch.distributed.run`) and read back what it recorded."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoaccel.run.harness import EpochCut

SEED = 0
POLL_INTERVAL = 0.25  # seconds between two looks at the progress file
STOP_GRACE_S = 10.0  # seconds a stopped run has to end its workers before SIGKILL


@dataclass
class Run:
    record: dict[str, Any]  # the harness record (ranks merged)
    returncode: int
    log: str  # the script's output, stdout and stderr together
    ranks: list[dict[str, Any]] = field(default_factory=list)  # each rank's own record

    @property
    def failed(self) -> bool:
        return self.returncode != 0 or self.record["exit"].startswith("error")


PYTHON_ENV = "AUTOACCEL_PYTHON"


def python_command() -> list[str]:
    """The interpreter that runs the user's script (the harness, torchrun, `tune`'s
    measurement): `AUTOACCEL_PYTHON`, split as a shell would, else autoaccel's own. The
    command must accept Python's arguments and have autoaccel and torch (the tests point it
    at a process that has imported torch already and forks the runs)."""
    command = os.environ.get(PYTHON_ENV)
    return shlex.split(command) if command else [sys.executable]


def harness_command(
    record_path: Path,
    steps: int,
    nproc: int | None,
    progress: Path | None = None,
    scratch: Path | None = None,
    epoch_cut: EpochCut | None = None,
    batch_prints: bool = False,
) -> list[str]:
    """The command that starts the harness; with `nproc`, one process per rank."""
    launcher = python_command()
    if nproc is not None:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [
        *launcher,
        "-m",
        "autoaccel.run.harness",
        "--losses-out",
        str(record_path),
        "--max-steps",
        str(steps),
        "--seed",
        str(SEED),
        "--align-loader-rng",
        *(["--progress", str(progress)] if progress else []),
        *(["--scratch", str(scratch)] if scratch else []),
        *_epoch_cut_args(epoch_cut),
        *(["--batch-prints"] if batch_prints else []),
    ]


def _epoch_cut_args(epoch_cut: EpochCut | None) -> list[str]:
    if epoch_cut is None:
        return []
    if epoch_cut.steps is not None:
        return ["--epoch-steps", str(epoch_cut.steps)]
    return ["--epoch-samples", str(epoch_cut.samples)] if epoch_cut.samples is not None else []


def run_script(
    script: Path,
    args: list[str],
    steps: int,
    records: Path,
    nproc: int | None = None,
    import_from: Sequence[Path] = (),
    env: dict[str, str] | None = None,
    on_step: Callable[[int], None] | None = None,
    timeout: float | None = None,
    scratch: Path | None = None,
    epoch_cut: EpochCut | None = None,
    batch_prints: bool = False,
) -> Run:
    """Run `script args` for at most `steps` training steps, its records written into the
    empty folder `records`; the folders `import_from` go first on the module search path
    (PYTHONPATH), `env` is added to the environment, and `on_step` is told the steps done
    as they go.
    After `timeout` seconds the run (every process of it) is stopped: an error. With
    `scratch`, the files the script writes go into that folder; with `epoch_cut`, its
    training epochs end early; with `batch_prints`, the data of its first steps is
    fingerprinted (`autoaccel.run.harness`)."""
    env = {**os.environ, **(env or {}), "PYTHONHASHSEED": str(SEED)}
    if import_from:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [*map(str, import_from), env.get("PYTHONPATH")])
        )
    records.mkdir(parents=True, exist_ok=True)
    progress = records / "progress" if on_step else None
    command = harness_command(
        records / "record-{rank}.json", steps, nproc, progress, scratch, epoch_cut, batch_prints
    )
    with tempfile.TemporaryFile("w+", errors="replace") as log:
        proc = subprocess.Popen(
            [*command, str(script), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            timed_out = _wait(proc, timeout, progress, on_step)
        except KeyboardInterrupt:  # its own session: Ctrl-C does not reach it
            _stop_group(proc)
            raise
        log.seek(0)
        output = log.read()
    ranks = [json.loads(path.read_text()) for path in sorted(records.glob("record-*.json"))]
    remove_made_folders(ranks)
    if timed_out:
        error = f"error: stopped after {timeout:g} s (a process hung, or the steps take longer)"
        ranks = [{**rank, "exit": error} for rank in ranks] or [_empty_record(error)]
    if not ranks:
        ranks = [_empty_record(f"error: exit code {proc.returncode}")]
    return Run(merge_ranks(ranks), proc.returncode, output, ranks)


def remove_made_folders(ranks: list[dict[str, Any]]) -> None:
    """Remove the folders of the script's that a run with `scratch` made, deepest first,
    those left empty (all, unless another program wrote into one meanwhile)."""
    made = {folder for rank in ranks for folder in rank.get("made_folders", ())}
    for folder in sorted(made, key=lambda path: path.count(os.sep), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _wait(
    proc: subprocess.Popen,
    timeout: float | None,
    progress: Path | None,
    on_step: Callable[[int], None] | None,
) -> bool:
    """Wait for `proc`, telling `on_step` the steps done; True when it ran past `timeout`
    seconds and was stopped."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        finished = proc.poll() is not None
        if not finished and deadline is not None and time.monotonic() > deadline:
            _stop_group(proc)
            return True
        if on_step is not None and progress is not None and progress.is_file():
            done = progress.read_text()
            if done.isdigit():
                on_step(int(done))
        if finished:
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(POLL_INTERVAL)  # back as soon as it ends (a sleep cost 0.12 s a run)


def _empty_record(exit_status: str) -> dict[str, Any]:
    return {"losses": [], "times": [], "samples": [], "exit": exit_status}


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop `proc` and the processes it started: SIGTERM to its group first, which
    torchrun's agent passes on to its workers (torch starts each in a session of its own,
    out of the group's reach), then, after `STOP_GRACE_S` at most, SIGKILL to the group."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_GRACE_S)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has ended
        pass
    except (PermissionError, AttributeError):  # or Windows
        proc.kill()
    proc.wait()


def merge_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One record for a distributed run: losses averaged over the ranks (each rank's loss
    is the mean over its share of the batch), samples counted once across the ranks (see
    `distinct_samples`), peaks the largest, times and device from rank 0, and the first
    error of any rank."""
    ranks = sorted(ranks, key=lambda r: r.get("rank", 0))
    merged = dict(ranks[0])
    if len(ranks) == 1:
        return merged
    steps = min(len(r["losses"]) for r in ranks)
    merged["losses"] = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(steps)]
    merged["samples"] = distinct_samples(ranks, steps)
    merged["times"] = merged["times"][:steps]
    for peak in ("peak_rss_bytes", "peak_cuda_bytes"):
        values = [r[peak] for r in ranks if r.get(peak) is not None]
        merged[peak] = max(values) if values else None
    merged["exit"] = next(
        (r["exit"] for r in ranks if r["exit"].startswith("error")), merged["exit"]
    )
    return merged


def distinct_samples(ranks: list[dict[str, Any]], steps: int) -> list[int]:
    """Cumulative samples of the whole job at each step, a sample that several ranks
    trained on in the same pass counted once: a script whose data is not sharded trains
    every rank on the same samples, which is no more throughput than one rank's. Steps
    without sample indices (an `IterableDataset`) count every rank's batch."""
    seen: set[tuple[int, int]] = set()
    total, cumulative = 0, []
    for step in range(steps):
        for rank in ranks:
            ids = (rank.get("sample_ids") or [None] * steps)[step]
            if ids is None:
                previous = rank["samples"][step - 1] if step else 0
                total += rank["samples"][step] - previous
                continue
            pass_number, indices = ids
            fresh = {(pass_number, index) for index in indices} - seen
            seen |= fresh
            total += len(fresh)
        cumulative.append(total)
    return cumulative
