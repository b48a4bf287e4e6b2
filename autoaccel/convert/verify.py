"""The proof of a `--to ddp|fsdp` conversion (run before it is written, unless
`--no-verify`): run it on two CPU processes and check it trains like the original.

The original runs for a few steps in one process (or its run for facts is reused), its
training epochs cut short after a quarter of the steps, so that the run goes through the
ends of epochs (their prints, averages and saves); the conversion runs under
`torchrun --nproc_per_node=2` (gloo), its processes' epochs cut where they have handed out,
together, what the original's epoch did (`autoaccel.run.harness --epoch-steps/--epoch-samples`), both in the current folder
(relative data paths work) with their writes sent to a scratch folder (the script's
files stay as they are), both under `autoaccel.run.harness`, which records each rank's
losses, the samples each step trained on, the files it wrote (`torch.save` and every
file opened for writing), the lines it printed and a digest of every optimizer's
parameters at the first step and at the end. The checks are the ones the tests make on
the fixtures:

* every process finishes (a hang is stopped after the timeout); the check says how many
  epoch ends the runs went through, or that none did (what runs after is not proven).
  Where the original ran to its end, the processes must reach theirs (they get twice the
  steps: their epochs take more where their global batch is rounded down). A
  crash is named by its root cause: the first error that is not another process's
  consequence (a connection its peer closed, a collective that timed out, torchrun's
  SIGTERM), with the innermost line of the user's files in its traceback, the converted
  script's lines mapped back to the user's (`loops.py:12: AssertionError: ...`);
* the processes train on disjoint samples (with no DataLoader: not on the same data),
  together on the original's batch a step (a batch that does not divide by the number of
  processes is rounded down; `--per-process-batch`: on `PROCESSES` times it);
* the parameters are equal on every process after the same steps;
* the optimizers change the parameters they hold wherever the original's do (an
  optimizer built before the model was sharded holds tensors the model no longer uses),
  and some parameters change at all;
* no file is written by more than one process (names equal but for their numbers count
  as one file: TensorBoard names its event files by process id and time);
* the averages and totals the original prints or logs (numbers labelled loss, avg, mean,
  total, sum, matched by the text of their line and the order printed; the scalars given
  to TensorBoard or wandb under such a tag, by their tag) are not off by the number of
  processes in every line (a shard's sum divided by the whole set's size prints half).
  Not "within the noise of another seed": a few printed numbers give no estimate of that
  noise, and early in training a single batch's loss or an accuracy differs between
  seeds by far more than the 30% the loss check allows;
* the loss stays close to the original's (the mean over the second half of the steps).
"""

from __future__ import annotations

import math
import os
import re
import statistics
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autoaccel.convert.log import DIFFERENT_DATA, LOSS_CLOSE
from autoaccel.diff import inserted, original_line
from autoaccel.facts.user_code import is_user_file
from autoaccel.fileio import write_atomic
from autoaccel.run.harness import EpochCut
from autoaccel.run.runner import Run, run_script

PROCESSES = 2
DEFAULT_STEPS = 20
EPOCHS_SEEN = 4  # a training epoch lasts at most steps / EPOCHS_SEEN steps in the runs
DEFAULT_TIMEOUT_S = 300.0
PARAMETER_TOLERANCE = 1e-6  # relative: the ranks apply the same averaged gradients
# The processes shuffle with their own generator and draw their own noise, so their
# short curves differ from the original's like another seed's. Measured gaps (20 steps,
# CPU, torch 2.13): cnn_toplevel 2 %, trainer_methods 7 %, mnist_main 15 %, step_functions
# 24 % (a ~0.06 focal loss on 16-sample halves), fresh_batches 22 % (each process draws a
# full batch); summed_loss without the WORLD_SIZE factor: 126 %.
LOSS_TOLERANCE = 0.3
NOISE_SIGMAS = 3
# A printed average or total off by the number of processes, within this much.
PROCESS_FACTOR_TOLERANCE = 0.15
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
# A word of a label or tag: `val/loss`, `validation.g_loss` and `loss_avg` too (not `losses`).
# (Not an accuracy: early in training two seeds' accuracies may differ twofold.)
_AVERAGE_LABEL = re.compile(
    r"(?<![^\W_])(?:avg|average|mean|total|sum|loss)(?![^\W_])", re.IGNORECASE
)
ORIGINAL_RUNS = "the original runs"
# Errors a process gets because another one failed: its peer's connection closed, a
# collective that timed out waiting, torchrun's SIGTERM to the processes left.
_CONSEQUENCE = re.compile(
    r"connection (?:reset|closed|refused)|broken pipe|remote process exited|timed out|timeout"
    r"|sigterm|signal:? ?15|ChildFailedError|communicator was aborted",
    re.IGNORECASE,
)
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+)')


@dataclass(frozen=True)
class VerifyRequest:
    """The proof: the script's arguments, how many training steps to run, and the
    original's run when it ran already (for facts, as many steps)."""

    script_args: list[str]
    steps: int = DEFAULT_STEPS
    timeout: float = DEFAULT_TIMEOUT_S
    original: Run | None = None
    per_process_batch: bool = False  # the conversion keeps the batch per process, not global
    batch_rounds: bool = False  # the processes share batches no DataLoader makes by rounds

    @property
    def epoch_steps(self) -> int:
        """The steps after which a training epoch of the original's run ends."""
        return max(1, self.steps // EPOCHS_SEEN)


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    @property
    def line(self) -> str:
        return f"--verify {'ok  ' if self.passed else 'FAIL'} {self.name}: {self.detail}"


@dataclass(frozen=True)
class Proof:
    """What the report says of the proof: the checks that passed, or why none ran."""

    checks: tuple[Check, ...] = ()
    not_run: str = ""


# Writes a conversion into an empty folder; returns the converted script's path there and
# the folders its imports are found in.
WriteConversion = Callable[[Path], tuple[Path, list[Path]]]


def verify_ddp(
    script: Path,
    write_conversion: WriteConversion,
    request: VerifyRequest,
    import_roots: list[Path],
    on_status: Callable[[str], None] | None = None,
    original: Run | None = None,
) -> tuple[list[Check], str]:
    """Run `script` (one process; its imports found in `import_roots`; not when its
    `original` run is given) and its conversion, which `write_conversion` writes (two
    processes, gloo), for `request.steps` training steps. The checks, and the output of
    the run that failed (empty when none did); a failed original is the one check
    `ORIGINAL_RUNS`, its detail the line that says why."""
    status = on_status or (lambda text: None)
    script_args, steps, timeout = request.script_args, request.steps, request.timeout
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory(prefix="autoaccel-verify-") as folder:
        scratch = Path(folder)
        (scratch / "converted").mkdir()
        copy, copy_roots = write_conversion(scratch / "converted")
        if original is None:
            status("original script, 1 process")
            original = run_script(
                script,
                script_args,
                steps,
                scratch / "original",
                import_from=import_roots,
                env=threads,
                timeout=timeout,
                scratch=scratch,
                epoch_cut=EpochCut(steps=request.epoch_steps),
                batch_prints=True,
            )
        if original.failed:
            return [Check(ORIGINAL_RUNS, False, failure_line(original))], original.log
        status(f"converted script, {PROCESSES} processes (gloo)")
        epoch_samples = original.record.get("epoch_samples")
        ddp = run_script(
            copy,
            script_args,
            # an original that ran to its end: room for the processes to reach theirs too,
            # though their epochs take more steps (a global batch rounded down: < 2 times)
            2 * steps if original.record["exit"] == "ok" else steps,
            scratch / "ddp",
            nproc=PROCESSES,
            import_from=copy_roots,
            env=threads,
            timeout=timeout,
            scratch=scratch,
            epoch_cut=None if epoch_samples is None else EpochCut(samples=epoch_samples),
            batch_prints=True,
        )
        found = checks(
            original,
            ddp,
            user_place(script, copy, scratch / "converted"),
            PROCESSES if request.per_process_batch else 1,
            request.batch_rounds,
        )
    if all(c.passed for c in found):
        return found, ""
    crash = root_crash(ddp) if not found[0].passed else None
    return found, (
        ddp.log[: crash[0].end] if crash else ddp.log
    )  # the output up to the first failure


def failure_line(run: Run) -> str:
    """Why a run failed, in a line: the last line of its output (the exception, or
    argparse's `error: the following arguments are required`), else its exit status."""
    lines = [line.strip() for line in run.log.splitlines() if line.strip()]
    return lines[-1] if lines else run.record["exit"].removeprefix("error: ")


# Where a frame of a traceback is in the user's files, as `path:line` (None: a library's).
Place = Callable[[str, int], "str | None"]


@dataclass(frozen=True)
class Crash:
    """A traceback in a run's output: its exception's first line, the frames' files and
    lines (outermost first), and where in the output it ends."""

    error: str
    frames: tuple[tuple[str, int], ...]
    end: int

    @property
    def exception(self) -> str:
        """The exception as the harness records it: `DistBackendError: ...`, not
        `torch.distributed.DistBackendError: ...`."""
        return re.sub(r"^[\w.]+\.(?=\w+(?::|$))", "", self.error)

    @property
    def consequence(self) -> bool:
        """Whether another process's failure explains it."""
        return bool(_CONSEQUENCE.search(self.error))


def crashes(log: str) -> list[Crash]:
    """The tracebacks in `log`, in the order printed (each of a chain on its own)."""
    found: list[Crash] = []
    frames: list[tuple[str, int]] | None = None
    position = 0
    for line in log.splitlines(keepends=True):
        position += len(line)
        text = line.rstrip()
        if text == _TRACEBACK:
            frames = []
        elif frames is not None and (frame := _FRAME.match(text)):
            frames.append((frame["file"], int(frame["line"])))
        elif frames and text and not text[0].isspace():
            found.append(Crash(text, tuple(frames), position))
            frames = None
    return found


def _shown(path: Path, line: int) -> str:
    """`path:line`, the path relative to the current folder when it is in it."""
    return f"{os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else path}:{line}"


def own_code(file: str, line: int) -> str | None:
    """The place of a frame outside the libraries, as the run names it."""
    return _shown(Path(file), line) if is_user_file(file) else None


def user_place(script: Path, copy: Path, converted: Path) -> Place:
    """The place of a frame in the user's files: a file of the converted copy in the
    folder `converted` (`copy` is the script's) is named as the user's file it was
    converted from, its line mapped back through the conversion."""
    copy, converted = copy.resolve(), converted.resolve()
    depth = len(copy.relative_to(converted).parts) if copy.is_relative_to(converted) else 0
    root = script.resolve().parents[depth - 1] if depth else None  # the copy's folder, the user's

    def place(file: str, line: int) -> str | None:
        if not is_user_file(file):
            return None
        path = Path(file).resolve()
        if path == copy:
            user = script
        elif root is not None and path.is_relative_to(converted):
            user = root / path.relative_to(converted)
        else:  # a module of the user's imported from where it is
            return _shown(path, line)
        try:
            texts = [item.read_text(encoding="utf-8", errors="replace") for item in (user, path)]
        except OSError:
            return _shown(user, line)
        shown = _shown(user, original_line([(texts[0], texts[1])], line))
        return (
            f"{shown} (in code the conversion added)"
            if inserted(texts[0], texts[1], line)
            else shown
        )

    return place


def write_one(script: Path, converted: str) -> WriteConversion:
    """How to write the conversion of the script alone: its modules are found beside the
    original."""

    def write(folder: Path) -> tuple[Path, list[Path]]:
        copy = folder / script.name
        write_atomic(copy, converted)
        return copy, [script.resolve().parent]

    return write


def checks(
    original: Run,
    ddp: Run,
    place: Place = own_code,
    batch_factor: int = 1,
    batch_rounds: bool = False,
) -> list[Check]:
    """What the two runs show, one check per property (see the module docstring); a
    crash is named at the frame `place` finds in the user's files; the processes train
    on `batch_factor` times the original's batch between them (`PROCESSES` where each
    keeps the original's batch), and share the original's batches by rounds where
    `batch_rounds`."""
    ranks = sorted(ddp.ranks, key=lambda r: r.get("rank", 0))
    finished = _finished(ddp, ranks, place)
    if not finished.passed:
        return [finished]
    if original.record["exit"] == "ok" and any(r["exit"] == "max-steps" for r in ranks):
        return [
            replace(
                finished,
                passed=False,
                detail=f"the original ran to its end in {len(original.record['losses'])} steps;"
                f" the processes were stopped after {len(ranks[0]['losses'])}, before theirs",
            )
        ]
    return [
        replace(finished, detail=f"{finished.detail}; {_epoch_ends(original)}"),
        (
            _batch_rounds(original, ranks)
            if batch_rounds
            else _disjoint(original, ranks, batch_factor)
        ),
        _same_parameters(ranks),
        _parameters_train(original, ranks[0]),
        _one_writer(ranks),
        _printed_values(original, ranks[0]),
        _close_loss(original, ddp),
    ]


def _finished(ddp: Run, ranks: list[dict[str, Any]], place: Place) -> Check:
    name = "every process finishes"
    errors = [r["exit"] for r in ranks if r["exit"].startswith("error")]
    if len(ranks) < PROCESSES or errors:
        return Check(
            name,
            False,
            _root_cause(ddp, ranks, place) or (errors[0] if errors else ddp.record["exit"]),
        )
    steps = {len(r["losses"]) for r in ranks}
    if len(steps) > 1:
        return Check(
            name, False, f"the processes took {sorted(steps)} steps: they did not stop together"
        )
    return Check(name, True, f"{PROCESSES} processes, {steps.pop()} steps each")


def root_crash(ddp: Run) -> tuple[Crash, int | None] | None:
    """The traceback of the process that failed of its own accord (no consequence of
    another's failure), and its rank: the first that a process's record names as its
    error, else the first at all (a process killed before it wrote its record)."""
    ranks = sorted(ddp.ranks, key=lambda r: r.get("rank", 0))
    own = [crash for crash in crashes(ddp.log) if not crash.consequence]
    for crash in own:
        for rank in ranks:
            if rank["exit"].startswith(f"error: {crash.exception}"):
                return crash, rank.get("rank", 0)
    return (own[0], None) if own else None


def _root_cause(ddp: Run, ranks: list[dict[str, Any]], place: Place) -> str:
    """Why the processes failed, from the one that failed of its own accord: its
    exception, at the innermost frame in the user's files, and which process it was;
    empty when every error is a consequence of another."""
    found = root_crash(ddp)
    if found is None:
        return next(
            (
                r["exit"]
                for r in ranks
                if r["exit"].startswith("error") and not _CONSEQUENCE.search(r["exit"])
            ),
            "",
        )
    crash, rank = found
    where = next(filter(None, (place(file, line) for file, line in reversed(crash.frames))), None)
    process = "" if rank is None else f" (process {rank})"
    return f"{where + ': ' if where else ''}{crash.exception}{process}{_why(crash)}"


# DDP's broadcast of the buffers at each forward writes each buffer back from a flat copy,
# which fails on a buffer that is a strided view (`pe.unsqueeze(0).transpose(0, 1)`).
_BUFFER_BROADCAST = (
    "single memory location",
    "DistributedDataParallel's broadcast of the model's buffers from process 0 cannot write"
    " a buffer that is a strided view (a positional encoding registered as"
    " `pe.unsqueeze(0).transpose(0, 1)`): register a contiguous copy"
    " (`.clone(memory_format=torch.contiguous_format)`), or, where no buffer changes in"
    " training, pass `broadcast_buffers=False` to DistributedDataParallel",
)


# FSDP2 hands each sharded block's output on through an autograd function; an in-place op
# on that output (`nn.ReLU(inplace=True)` first in the next block) is refused by autograd.
_IN_PLACE_ON_BLOCK_OUTPUT = (
    "Output 0 of RegisterPostBackwardFunction is a view and is being modified inplace",
    "FSDP passes each sharded block's output on through an autograd function, and an"
    " in-place operation on that output is not allowed (a residual block's"
    " `nn.ReLU(inplace=True)` applied first to its input): make that operation out of place"
    " (`inplace=False`), by hand; where the code reads that input again after it (`x +"
    " self.block(x)`), it read the changed values, so keep them (`x = x.relu()` first)",
)


# `torch.save(model, path)` of a sharded model: FSDP2 swaps its class for a generated one.
_PICKLED_SHARDED_MODEL = (
    "Can't pickle <class 'torch.distributed.fsdp.",
    "the script saves the sharded model object itself (`torch.save(model, path)`), whose"
    " class FSDP made for it cannot be pickled: save its state dict instead"
    " (`torch.save(model.state_dict(), path)`, which the conversion gathers), and load that"
    " into a model built as before",
)


def _why(crash: Crash) -> str:
    """What a crash inside DistributedDataParallel or FSDP means, where its message does
    not say what to do."""
    words, meaning = _BUFFER_BROADCAST
    inside = any(file.endswith("parallel/distributed.py") for file, _ in crash.frames)
    if inside and words in crash.exception:
        return f": {meaning}"
    for words, meaning in (_IN_PLACE_ON_BLOCK_OUTPUT, _PICKLED_SHARDED_MODEL):
        if words in crash.exception:
            return f": {meaning}"
    return ""


def _epoch_ends(original: Run) -> str:
    """How far the original's run went: to its end, or through how many cut epochs."""
    cut = original.record.get("epochs_cut", 0)
    if original.record["exit"] == "ok":
        return (
            f"the original ran to its end ({cut} epoch(s) cut short)"
            if cut
            else "the original ran to its end"
        )
    if cut:
        return f"{cut} epoch end(s) seen (training epochs cut short); what runs after is not proven"
    return "no epoch ended in these steps: what runs after them is not proven"


def _disjoint(original: Run, ranks: list[dict[str, Any]], batch_factor: int = 1) -> Check:
    """Within each pass over the data, no sample on two processes, a new order in each
    pass where the original reshuffles (a DistributedSampler never told `set_epoch` reads
    the same order every epoch), and together `batch_factor` times the original's batch a
    step (a batch that does not divide by the processes is rounded down). A sampler that
    draws with replacement (a process meets a sample twice in one pass) may draw a sample
    on two processes by chance: not counted then."""
    name = DIFFERENT_DATA
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
            shared += sum(len(a & b) for i, a in enumerate(sets) for b in sets[i + 1 :])
        if shared:
            return Check(
                name,
                False,
                f"{shared} of {seen} samples were trained on by more than one process in the same epoch",
            )
        stale = [r.get("rank", 0) for r in ranks if _repeats_its_order(r)]
        if stale and not _repeats_its_order(original.record):
            return Check(
                name,
                False,
                f"process {stale[0]} trains on its samples in the same order in every epoch, where the"
                " original reshuffles: its DistributedSampler is not told the epoch (call"
                " `loader.sampler.set_epoch(epoch)` at the start of every epoch)",
            )
        batch, wanted = _step_batch(ranks), _step_batch([original.record])
        if batch and wanted and batch != wanted * batch_factor:
            return Check(name, False, _batch_differs(batch, wanted * batch_factor))
        how = f"; {replaced} pass(es) drawn with replacement" if replaced else ""
        return Check(
            name, True, f"{seen} samples, none trained on by two processes in the same epoch{how}"
        )
    losses = [r["losses"] for r in ranks]
    if all(series == losses[0] for series in losses[1:]):
        return Check(
            name, False, "every process computed the same losses: they train on the same data"
        )
    return _different_inputs(original, ranks)


def _different_inputs(original: Run, ranks: list[dict[str, Any]]) -> Check:
    """Without DataLoader indices, what the processes' models received in their first
    steps (`batch_prints`) tells: processes that feed the same tensors in most steps
    train on the same data, whatever their losses (dropout seeded per process makes
    those differ on the same batches). What every step of the original received alike
    (a fixed noise, a mask) tells nothing and is left out."""
    name = DIFFERENT_DATA
    _, constant = _original_prints(original)
    steps = [[set(step) - constant for step in rank.get("batch_prints") or []] for rank in ranks]
    compared = [step for step in zip(*steps) if all(step)]
    if not compared:
        return Check(
            name,
            False,
            "not proven: no DataLoader indices, and the models received no tensors to tell"
            " the processes' data apart by",
        )
    shared = sum(any(a & b for i, a in enumerate(step) for b in step[i + 1 :]) for step in compared)
    if 2 * shared > len(compared):
        return Check(
            name,
            False,
            f"in {shared} of the first {len(compared)} steps, two processes fed their models the"
            " same tensors: they train on the same data (their losses differ only by their random"
            " numbers); give each process its share of the batches",
        )
    return Check(
        name,
        True,
        f"no DataLoader indices; the processes' models received different tensors in"
        f" {len(compared) - shared} of the first {len(compared)} steps",
    )


def _batch_rounds(original: Run, ranks: list[dict[str, Any]]) -> Check:
    """Each process first trains on a batch of the original's first ones (by what its
    models received: `batch_prints`) that no other process trains on first: the processes
    make the original's batches alike and take their shares of them. What every recorded
    step of the original received alike (an initial hidden state, a fixed noise) tells no
    batch apart and is left out; what the processes share besides (noise drawn alike on
    every process) tells none apart either."""
    name = DIFFERENT_DATA
    theirs, constant = _original_prints(original)
    known = set().union(*theirs) - constant
    if not known:
        return Check(
            name,
            False,
            "not proven: the original's models received no tensors to tell its batches apart"
            " by, so nothing shows that the processes make the same batches",
        )
    firsts = [set((rank.get("batch_prints") or [[]])[0]) - constant for rank in ranks]
    for position, first in enumerate(firsts):
        others = set().union(*(f for i, f in enumerate(firsts) if i != position))
        if not (first - others) & known:
            return Check(
                name,
                False,
                f"process {position} first trains on data that is not one of the original's"
                f" first {len(theirs)} batches, or that another process trains on too: the"
                " processes do not make the same batches (a random generator that no process"
                " seeds alike, an order that differs between processes?), so their shares"
                " overlap",
            )
    return Check(
        name,
        True,
        f"each of the {len(ranks)} processes first trains on its own one of the original's"
        f" first {len(theirs)} batches: they share the original's batches by rounds",
    )


def _original_prints(original: Run) -> tuple[list[set[str]], set[str]]:
    """The data fingerprints of the original's first steps, and those every one of its
    steps received alike (an initial hidden state, a fixed noise), which tell no batch
    apart."""
    theirs = [set(step) for step in original.record.get("batch_prints") or []]
    return theirs, set.intersection(*theirs) if len(theirs) > 1 else set()


def _step_batch(runs: list[dict[str, Any]]) -> int | None:
    """The samples a step trains on, the processes' together: the most common count over
    the steps with DataLoader indices (None: none has)."""
    counts = Counter(
        sum(len(ids[1]) for ids in step if ids is not None)
        for step in zip(*(run.get("sample_ids") or [] for run in runs))
    )
    counts.pop(0, None)
    return counts.most_common(1)[0][0] if counts else None


def _batch_differs(batch: int, wanted: int) -> str:
    """Why a global batch of `batch` samples is not the `wanted` one."""
    advice = (
        f": {wanted} does not divide by {PROCESSES} processes, and each loads its share rounded"
        " down; give a batch size that divides by the number of processes"
        if wanted % PROCESSES
        else ""
    )
    return (
        f"the processes train on a global batch of {batch} samples a step where the original"
        f" trains on {wanted}{advice}"
    )


def _repeats_its_order(record: dict[str, Any]) -> bool:
    """Whether the first two passes a run trained on begin with the same samples in the
    same order (False with fewer than two passes)."""
    passes: dict[int, list[int]] = {}
    for ids in record.get("sample_ids") or []:
        if ids is not None:
            passes.setdefault(ids[0], []).extend(ids[1])
    if len(passes) < 2:
        return False
    first, second = list(passes.values())[:2]
    common = min(len(first), len(second))
    return common > 0 and first[:common] == second[:common]


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
            return Check(
                name,
                False,
                "the processes' parameters differ after the same steps: gradients are not synchronised",
            )
    fits = max(r.get("fits") or 0 for r in ranks)
    left_out = (
        f"; {fits} fitted anew on each process left out (an optimizer built after training"
        " began, never stepped on a DataLoader's batch: a probe)"
        if fits
        else ""
    )
    return Check(
        name,
        True,
        f"{len(reference)} parameter set(s) (optimizers, DDP models), the same{left_out}",
    )


def _parameters_train(original: Run, rank: dict[str, Any]) -> Check:
    """Each parameter set the original's training changes changes in the conversion too
    (compared set by set when both have as many, else as a whole)."""
    name = "the optimizers update the model"
    before, after = (
        original.record.get("first_param_digest") or [],
        original.record.get("param_digest") or [],
    )
    mine, mine_after = rank.get("first_param_digest") or [], rank.get("param_digest") or []
    if rank.get("freed_parameters"):
        return Check(
            name,
            False,
            f"the optimizer holds {rank['freed_parameters']} tensor(s) whose memory FSDP let go:"
            " whole parameters it gathered for a call, not the model's shards (an optimizer"
            " built inside a method registered as a forward method?)",
        )
    trained = [a != b for a, b in zip(before, after)]
    updated = [a != b for a, b in zip(mine, mine_after)]
    if not any(trained):
        if any(updated):
            return Check(
                name, True, f"{sum(updated)} parameter set(s) trained (the original's records none)"
            )
        return Check(
            name,
            False,
            f"no parameter changes in {len(rank['losses'])} steps, in the original or the"
            " conversion: nothing shows the model trains (more --verify-steps, if the first"
            " update comes later)",
        )
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
    """No file written by two processes: `torch.save` and every file opened for writing
    (`np.save`, `savefig`, TensorBoard, logs), names that differ in their numbers only
    (a process id, a time) taken as one file."""
    name = "one process writes each file"
    writers: dict[str, dict[int, str]] = {}  # file, numbers left out -> rank -> path
    sites: dict[str, str] = {}  # path -> where the script's code wrote it
    for rank in ranks:
        sites.update(rank.get("write_sites") or {})
        for path in [*(rank.get("saves") or []), *(rank.get("writes") or [])]:
            writers.setdefault(_NUMBER.sub("#", path), {})[rank.get("rank", 0)] = path
    clashes = sorted(
        (sorted(set(paths.values())), len(paths)) for paths in writers.values() if len(paths) > 1
    )
    if clashes:
        paths, count = clashes[0]
        where = f" (written at {sites[paths[0]]})" if paths[0] in sites else ""
        return Check(name, False, f"{count} processes wrote {' and '.join(paths)}{where}")
    return Check(name, True, f"{len(writers)} file(s) written, each by one process")


def _printed_values(original: Run, rank: dict[str, Any]) -> Check:
    """Each average or total the original prints (a number after `loss`, `avg`, `mean`,
    `total` or `sum` in its line) or logs (a scalar of such a tag), as rank 0 prints it in
    the lines of the same text, or logs it under the same tag: not off by the number of
    processes in all of them (see the module docstring). Each number is compared as it
    is, and relative to the mean loss of the steps (of that process) since the same line
    was last printed (the tag logged): a sum of one process's losses divided by the whole
    set's size is then half of the original's, whatever noise the two runs' training
    adds."""
    name = "printed and logged averages and totals as the original's"
    mine = _averages(original.record, original.record.get("losses") or [])
    sites = original.record.get("log_sites") or {}  # the user's lines: the original ran them
    theirs = _averages(rank, rank.get("losses") or [])
    compared = 0
    for key, values in mine.items():
        pairs = [
            (a, b)
            for a, b in zip(values, theirs.get(key, []))
            if not (math.isnan(a[0]) or math.isnan(b[0]))
        ]
        if not pairs:
            continue
        compared += 1
        ratios = [printed / (expected or math.inf) for (expected, _), (printed, _) in pairs]
        relative = [r * scale / their_scale for r, ((_, scale), (_, their_scale)) in zip(ratios, pairs)
                    if scale and their_scale]  # fmt: skip
        for found in (ratios, relative if len(relative) == len(pairs) else []):
            if found and all(_off_by_processes(r) for r in found):
                (line, column), (expected, _), (printed, _) = key, *pairs[0]
                if column is None:
                    site = f" ({sites[line]})" if line in sites else ""
                    shown, what, place, each = f"tag `{line}`{site}", "logs", "", "value(s) logged"
                else:
                    shown, what, place, each = (
                        f"`{line}`",
                        "prints",
                        f"number {column + 1} of the line; ",
                        "line(s)",
                    )
                return Check(
                    name,
                    False,
                    f"{shown} {what} {printed:.4g} where the original {what} {expected:.4g}"
                    f" ({place}{found[0]:.2f} times{' per unit of loss' if found is relative else ''},"
                    f" and so in each of the {len(pairs)} {each}): off by the number of processes"
                    " (a sum over one process's share divided by the whole set's size?)",
                )
    if not compared:
        return Check(name, True, "no printed or logged average or total in both runs: not checked")
    return Check(
        name,
        True,
        f"{compared} printed or logged average(s) or total(s), none off by the number of processes",
    )


# A labelled number: its printed line's text (numbers as `#`) and its place in the line,
# or the tag it was logged under (place None).
_Label = tuple[str, int | None]


def _averages(
    record: dict[str, Any], losses: list[float]
) -> dict[_Label, list[tuple[float, float | None]]]:
    """The numbers labelled as averages or totals in a run's printed lines and logged
    scalars, by `_Label`, in the order printed (logged), each with the mean of `losses` over
    the steps since the same label was printed (logged) before (None: no step). A number
    that is, to its printed digits, the loss of the step just done (`loss {loss.item()}`
    after the last batch) is no average: NaN, which compares with nothing."""
    found: dict[_Label, list[tuple[float, float | None]]] = {}
    last_step: dict[_Label, int] = {}
    for key, value, step, digits in _labelled(record):
        since = losses[last_step.get(key, 0) : step] if step is not None else []
        if step and step <= len(losses) and abs(value - losses[step - 1]) <= digits:
            value = math.nan
        found.setdefault(key, []).append((value, statistics.fmean(since) if since else None))
        if step is not None:
            last_step[key] = step
    return found


def _labelled(record: dict[str, Any]) -> Iterator[tuple[_Label, float, int | None, float]]:
    """The numbers after the labels of `_AVERAGE_LABEL` in a run's printed lines,
    then the scalars it logged under such a tag, each with its label, the steps done by
    then (None: not recorded) and how far its printed digits may round it."""
    lines, steps = record.get("printed") or [], record.get("printed_steps") or []
    for index, line in enumerate(lines):
        step = steps[index] if index < len(steps) else None
        start = 0
        for column, number in enumerate(_NUMBER.finditer(line)):
            if _AVERAGE_LABEL.search(line, start, number.start()):
                text = number.group()
                decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 6
                yield (_NUMBER.sub("#", line), column), float(text), step, 0.5 * 10**-decimals
            start = number.end()
    for tag, value, step in record.get("logged") or []:
        if _AVERAGE_LABEL.search(tag):
            yield (tag, None), value, step, 1e-6 * max(1.0, abs(value))


def _off_by_processes(ratio: float) -> bool:
    return any(
        abs(ratio - factor) <= PROCESS_FACTOR_TOLERANCE * factor
        for factor in (PROCESSES, 1 / PROCESSES)
    )


def _close_loss(original: Run, ddp: Run) -> Check:
    """The mean loss over the second half of the common steps, within `LOSS_TOLERANCE` of
    the original's or within the noise of the two means (`NOISE_SIGMAS` standard errors,
    from the step-to-step noise: a script whose batches vary a lot differs that much from
    itself with another seed, while a trend down the curve is no noise).
    The processes' losses are averaged per step; a summed loss left unscaled shows as
    half the original's."""
    name = LOSS_CLOSE
    steps = min(len(original.record["losses"]), len(ddp.record["losses"]))
    if steps < 2:
        return Check(name, True, f"{steps} step(s): too few to compare")
    halves = [run.record["losses"][steps // 2 : steps] for run in (original, ddp)]
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
