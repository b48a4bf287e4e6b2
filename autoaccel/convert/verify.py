"""`convert --to ddp --verify`: run the conversion on two CPU processes and check it
trains like the original before anything is written.

The original runs for a few steps in one process, the conversion under
`torchrun --nproc_per_node=2` (gloo), both in the current folder (relative data paths
work) with `torch.save` sent to a scratch folder (the script's checkpoints stay as they
are), both under `autoaccel.harness`, which records
each rank's losses, the samples each step trained on, the files `torch.save` wrote and
a digest of every optimizer's parameters at the end. The checks are the ones the tests
make on the fixtures:

* every process finishes (a hang is stopped after the timeout);
* the processes train on disjoint samples (with no DataLoader: not on the same data);
* the parameters are equal on every process after the same steps;
* the optimizers change the parameters they hold wherever the original's do (an
  optimizer built before the model was sharded holds tensors the model no longer uses);
* no file is written by more than one process;
* the loss stays close to the original's (the mean over the second half of the steps).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoaccel.bench.runner import Run, run_script
from autoaccel.fileio import write_atomic

PROCESSES = 2
DEFAULT_STEPS = 20
DEFAULT_TIMEOUT_S = 300.0
PARAMETER_TOLERANCE = 1e-6  # relative: the ranks apply the same averaged gradients
# The processes shuffle with their own generator and draw their own noise, so their
# short curves differ from the original's like another seed's. Measured gaps (20 steps,
# CPU, torch 2.13): cnn_toplevel 2 %, trainer_methods 7 %, mnist_main 15 %, step_functions
# 24 % (a ~0.06 focal loss on 16-sample halves), fresh_batches 22 % (each process draws a
# full batch); summed_loss without the WORLD_SIZE factor: 126 %.
LOSS_TOLERANCE = 0.3
NOISE_SIGMAS = 3


@dataclass(frozen=True)
class VerifyRequest:
    """`--verify`: the script's arguments and how many training steps to run."""

    script_args: list[str]
    steps: int = DEFAULT_STEPS
    timeout: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    @property
    def line(self) -> str:
        return f"--verify {'ok  ' if self.passed else 'FAIL'} {self.name}: {self.detail}"


# Writes a conversion into an empty folder; returns the converted script's path there and
# the folders its imports are found in.
WriteConversion = Callable[[Path], tuple[Path, list[Path]]]


def verify_ddp(
    script: Path,
    write_conversion: WriteConversion,
    request: VerifyRequest,
    import_roots: list[Path],
    on_status: Callable[[str], None] | None = None,
) -> tuple[list[Check], str]:
    """Run `script` (one process; its imports found in `import_roots`) and its
    conversion, which `write_conversion` writes (two processes, gloo), for
    `request.steps` training steps. The checks, and the output of the run that failed
    (empty when none did)."""
    status = on_status or (lambda text: None)
    script_args, steps, timeout = request.script_args, request.steps, request.timeout
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory(prefix="autoaccel-verify-") as folder:
        scratch = Path(folder)
        (scratch / "converted").mkdir()
        copy, copy_roots = write_conversion(scratch / "converted")
        status("original script, 1 process")
        original = run_script(
            script, script_args, steps, scratch / "original", import_from=import_roots,
            env=threads, timeout=timeout, scratch=scratch,
        )
        if original.failed:
            return [Check("original runs", False, f"the original script failed: {original.record['exit']}")], original.log
        status(f"converted script, {PROCESSES} processes (gloo)")
        ddp = run_script(
            copy, script_args, steps, scratch / "ddp", nproc=PROCESSES, import_from=copy_roots,
            env=threads, timeout=timeout, scratch=scratch,
        )
    found = checks(original, ddp)
    return found, ddp.log if not all(c.passed for c in found) else ""


def write_one(script: Path, converted: str) -> WriteConversion:
    """How to write the conversion of the script alone: its modules are found beside the
    original."""

    def write(folder: Path) -> tuple[Path, list[Path]]:
        copy = folder / script.name
        write_atomic(copy, converted)
        return copy, [script.resolve().parent]

    return write


def checks(original: Run, ddp: Run) -> list[Check]:
    """What the two runs show, one check per property (see the module docstring)."""
    ranks = sorted(ddp.ranks, key=lambda r: r.get("rank", 0))
    finished = _finished(ddp, ranks)
    if not finished.passed:
        return [finished]
    return [
        finished,
        _disjoint(ranks),
        _same_parameters(ranks),
        _parameters_train(original, ranks[0]),
        _one_writer(ranks),
        _close_loss(original, ddp),
    ]


def _finished(ddp: Run, ranks: list[dict[str, Any]]) -> Check:
    name = "every process finishes"
    errors = [r["exit"] for r in ranks if r["exit"].startswith("error")]
    if len(ranks) < PROCESSES or errors:
        return Check(name, False, errors[0] if errors else ddp.record["exit"])
    steps = {len(r["losses"]) for r in ranks}
    if len(steps) > 1:
        return Check(name, False, f"the processes took {sorted(steps)} steps: they did not stop together")
    return Check(name, True, f"{PROCESSES} processes, {steps.pop()} steps each")


def _disjoint(ranks: list[dict[str, Any]]) -> Check:
    """Within each pass over the data, no sample on two processes. A sampler that draws
    with replacement (a process meets a sample twice in one pass) may draw a sample on
    two processes by chance: not counted then."""
    name = "processes train on different data"
    passes: dict[int, list[list[int]]] = {}  # pass -> each rank's indices in it
    for position, rank in enumerate(ranks):
        for ids in rank.get("sample_ids") or []:
            if ids is not None:
                pass_number, indices = ids
                passes.setdefault(pass_number, [[] for _ in ranks])[position].extend(indices)
    seen = sum(len(indices) for per_rank in passes.values() for indices in per_rank)
    if seen:
        shared, replaced = 0, 0
        for per_rank in passes.values():
            if any(len(set(indices)) < len(indices) for indices in per_rank):
                replaced += 1
                continue
            sets = [set(indices) for indices in per_rank]
            shared += sum(len(a & b) for i, a in enumerate(sets) for b in sets[i + 1:])
        if shared:
            return Check(name, False, f"{shared} of {seen} samples were trained on by more than one process in the same epoch")
        how = f"; {replaced} pass(es) drawn with replacement" if replaced else ""
        return Check(name, True, f"{seen} samples, none trained on by two processes in the same epoch{how}")
    losses = [r["losses"] for r in ranks]
    if all(series == losses[0] for series in losses[1:]):
        return Check(name, False, "every process computed the same losses: they train on the same data")
    return Check(name, True, "no DataLoader indices; the processes' losses differ")


def _same_parameters(ranks: list[dict[str, Any]]) -> Check:
    name = "parameters equal on every process"
    digests = [r.get("param_digest") or [] for r in ranks]
    if not any(digests):
        return Check(name, True, "no optimizer or DDP model seen: not checked")
    reference = digests[0]
    for digest in digests[1:]:
        if len(digest) != len(reference) or any(
            abs(a - b) > PARAMETER_TOLERANCE * max(abs(a), abs(b), 1.0)
            for mine, theirs in zip(reference, digest)
            for a, b in zip(mine, theirs)
        ):
            return Check(name, False, "the processes' parameters differ after the same steps: gradients are not synchronised")
    return Check(name, True, f"{len(reference)} parameter set(s) (optimizers, DDP models), the same")


def _parameters_train(original: Run, rank: dict[str, Any]) -> Check:
    """Each parameter set the original's training changes changes in the conversion too
    (compared set by set when both have as many, else as a whole)."""
    name = "the optimizers update the model"
    before, after = original.record.get("first_param_digest") or [], original.record.get("param_digest") or []
    mine, mine_after = rank.get("first_param_digest") or [], rank.get("param_digest") or []
    trained = [a != b for a, b in zip(before, after)]
    updated = [a != b for a, b in zip(mine, mine_after)]
    if not any(trained):
        return Check(name, True, "the original changes no parameter set it records: not checked")
    if len(trained) == len(updated):
        stale = [i for i, (t, u) in enumerate(zip(trained, updated)) if t and not u]
    else:
        stale = [] if any(updated) else [0]
    if stale:
        return Check(
            name,
            False,
            f"parameter set {stale[0] + 1} never changes in the conversion, though the original"
            " trains it: its optimizer holds tensors the model no longer computes with (built"
            " before the model was wrapped or sharded?)",
        )
    return Check(name, True, f"{sum(trained)} parameter set(s) trained, as in the original")


def _one_writer(ranks: list[dict[str, Any]]) -> Check:
    name = "one process writes each file"
    writers: dict[str, set[int]] = {}
    for rank in ranks:
        for path in rank.get("saves") or []:
            writers.setdefault(path, set()).add(rank.get("rank", 0))
    clashes = sorted(path for path, who in writers.items() if len(who) > 1)
    if clashes:
        return Check(name, False, f"{len(writers[clashes[0]])} processes wrote {clashes[0]}")
    return Check(name, True, f"{len(writers)} file(s) saved, each by one process")


def _close_loss(original: Run, ddp: Run) -> Check:
    """The mean loss over the second half of the common steps, within `LOSS_TOLERANCE` of
    the original's or within the noise of the two means (`NOISE_SIGMAS` standard errors,
    from the step-to-step noise: a script whose batches vary a lot differs that much from
    itself with another seed, while a trend down the curve is no noise).
    The processes' losses are averaged per step; a summed loss left unscaled shows as
    half the original's."""
    name = "loss close to the original's"
    steps = min(len(original.record["losses"]), len(ddp.record["losses"]))
    if steps < 2:
        return Check(name, True, f"{steps} step(s): too few to compare")
    halves = [run.record["losses"][steps // 2:steps] for run in (original, ddp)]
    reference, converted = (statistics.fmean(half) for half in halves)
    noise = math.sqrt(sum(_step_noise(h) ** 2 / len(h) for h in halves if len(h) > 2))
    gap = abs(converted - reference) / max(abs(reference), 1e-12)
    passed = gap <= LOSS_TOLERANCE or abs(converted - reference) <= NOISE_SIGMAS * noise
    detail = (
        f"mean loss of steps {steps // 2 + 1}-{steps}: {converted:.4g} vs {reference:.4g},"
        f" {gap:.1%} apart (tolerance {LOSS_TOLERANCE:.0%}, or {NOISE_SIGMAS} standard"
        f" errors: {NOISE_SIGMAS * noise:.3g})"
    )
    return Check(name, passed, detail)


def _step_noise(losses: list[float]) -> float:
    """The standard deviation of one step's loss around the curve's trend: successive
    differences remove a slow trend, and each holds the noise of two steps."""
    differences = [b - a for a, b in zip(losses, losses[1:])]
    return statistics.stdev(differences) / math.sqrt(2)
