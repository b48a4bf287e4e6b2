"""Run a training script unchanged and record every training step.

    python -m autoaccel.run.harness --losses-out PATH [--max-steps N] [--seed S]
                                [--align-loader-rng] [--progress PATH] [--scratch DIR]
                                [--epoch-steps K | --epoch-samples S] [--batch-prints]
                                SCRIPT [script args...]

The script runs as ``__main__`` in this process (``runpy``). A training step is one
``Tensor.backward()`` on a scalar: the harness records its loss, the time it was called and
how many samples the DataLoaders had handed out by then. Under ``torch.amp.GradScaler`` the
recorded loss is the *unscaled* one: ``GradScaler.scale`` marks the tensor it returns with
its scale, and the record divides it back out. Losses stay on the device until the run ends,
so recording adds no host sync to a step. ``--max-steps N`` stops the script after N steps.

``--align-loader-rng`` keeps the global random stream of a script whose DataLoaders use
``persistent_workers=True`` in step with the same script without them: a DataLoader draws one
seed from the global RNG for every new iterator, and a persistent one creates its iterator
only once, so from the second epoch on the two would shuffle and drop out differently.

With ``AUTOACCEL_FORCE_AUTOCAST=1`` in the environment every ``torch.autocast`` region runs
enabled, whatever its ``enabled=`` says: the converted scripts enable autocast only on CUDA,
and this shows their mixed-precision numbers on a CPU (GradScalers are left as they are;
bf16 needs none). An environment variable, so that it reaches the harness through
``autoaccel bench`` and every rank that torchrun starts.

``--epoch-steps K`` cuts every epoch of a training DataLoader (one whose batches reached a
``backward()``) short after K batches, so that a run of a few steps goes through the ends of
several epochs (their prints, averages and saves); evaluation loaders run whole. The record's
``epoch_samples`` is what such an epoch handed out, and ``--epoch-samples S`` cuts the epochs
of each process of a distributed run after S / WORLD_SIZE samples: its processes then cover,
together, what the one process covered.

``--progress PATH`` writes the number of steps done into PATH, at most five times a second
(and at the last step).

``--scratch DIR`` sends what ``torch.save`` writes into DIR (``torch.load`` of such a path
reads it back from there), and every file opened for writing (``open``, ``io.open``: so also
``np.save``, ``savefig``, ``Path.write_text``, a Pillow ``anim.save``, TensorBoard event files;
reads of such a path read it back from there, and ``os.chmod``, ``os.utime`` change it there:
``shutil.copy`` into a folder of the script's), so that a trial run leaves the script's files
alone; the folders it makes (``os.makedirs``, ``Path.mkdir``) are recorded in
``made_folders``, for the runner to remove once every process has ended. Files under the
temporary folder, the caches and Python's own folders are the libraries' and are left where
they go.

With ``AUTOACCEL_FACTS_OUT=PATH`` in the environment, `autoaccel.facts.recorder` also
records what the script makes and calls, keyed to source positions, into PATH (JSON; see
`autoaccel.facts.model`); the script's own ``open(..., "w")`` writes then go to DIR too.

The record also has ``saves`` (the paths each ``torch.save`` call wrote), ``writes`` (each
other path the script opened for writing, once), ``printed`` (the first lines ``print``
wrote to the terminal, and the messages of the script's ``logging`` calls that a handler
handled, at most `MAX_PRINTED`) and ``printed_steps`` (the steps done by then), ``logged``
(``[tag, value, steps done]`` of each number the script logged with a TensorBoard
``SummaryWriter``'s ``add_scalar``/``add_scalars`` or ``wandb.log``, at most `MAX_PRINTED`;
their classes are patched once the script imports their module, which the harness never
imports itself) and ``log_sites`` (where the script's code logged each tag first), and
``param_digest`` (per optimizer, then per model wrapped in DDP, the sum and the sum of
absolute values of its parameters at the end, in float64: equal on every rank of a distributed run when the gradients were
synchronised), and ``first_param_digest``, the same at the first step, before any update
(an optimizer whose parameters it never changes trains nothing); ``freed_parameters`` counts
the tensors an optimizer holds whose memory was let go, left out of the digests. Each step also records which
samples it trained on,
``sample_ids``: ``[pass, [dataset indices]]``, where ``pass`` numbers the passes over any
DataLoader in the order the script starts them (the same order on every rank), or None when
the loader has no indices (an ``IterableDataset``). Samples that two ranks both trained on
in the same pass are then counted once (`autoaccel.run.runner.merge_ranks`). With
``--batch-prints``, ``batch_prints`` has, for each of the first steps, hashes of the data
the step's models received (`autoaccel.run.batch_prints`): what tells batches apart that no
DataLoader handed out (the proof's runs ask for it; a benchmark's do not pay for it).

The record (JSON, written on every exit path; ``{rank}`` in PATH becomes ``$RANK``):
``losses``, ``times`` (``perf_counter`` at each step), ``samples`` (cumulative samples at each
step), ``sample_ids``, ``end_time``, ``peak_rss_bytes``,
``peak_cuda_bytes``, ``device``, ``device_name``, ``torch_version``, ``threads`` (torch's
intra-op threads), ``rank``, ``world_size`` and ``exit`` (``"ok"``, ``"max-steps"`` or
``"error: ..."``).

torch is imported only inside functions, so importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import builtins
import functools
import gc
import glob
import io
import json
import logging
import os
import platform
import random
import runpy
import shutil
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoaccel.facts.user_code import is_user_file, user_frame
from autoaccel.run.batch_prints import BatchPrints
from autoaccel.patching import patched

# Attribute set on tensors returned by GradScaler.scale: the scale tensor they carry.
_SCALE_ATTR = "_autoaccel_loss_scale"
# Attributes set on DataLoader iterators: the pass they serve, and the sample indices they
# drew and have not yet handed out (a worker pool draws some batches ahead).
_PASS_ATTR = "_autoaccel_pass"
_INDICES_ATTR = "_autoaccel_indices"
_TRAINS_ATTR = "_autoaccel_trains"  # on a DataLoader iterator whose batch reached a backward()
_EPOCH_SAMPLES_ATTR = "_autoaccel_epoch_samples"  # samples its current pass handed out
# on an optimizer: built after the first training step / stepped after a DataLoader's batch
_LATE_ATTR = "_autoaccel_late"
_ON_BATCHES_ATTR = "_autoaccel_on_batches"
PROGRESS_INTERVAL = 0.2  # seconds between two writes of the progress file
FORCE_AUTOCAST_ENV = "AUTOACCEL_FORCE_AUTOCAST"
_WRITE_MODES = frozenset("wax+")
MAX_PRINTED = 500  # lines of `printed`: what a check compares, not a log
# Where scripts log numbers: module -> the class whose methods are patched, and those methods.
_SCALAR_LOGGERS = {
    "torch.utils.tensorboard": ("SummaryWriter", ("add_scalar", "add_scalars")),
    "tensorboardX": ("SummaryWriter", ("add_scalar", "add_scalars")),
    "wandb": ("Run", ("log",)),  # `wandb.log` is the `log` of the run `wandb.init` made
}


class StopScript(BaseException):
    """Raised inside the script to end it early; a BaseException so that the script's own
    `except Exception:` blocks do not swallow it."""


@dataclass(frozen=True)
class EpochCut:
    """Where a training epoch ends early: after `steps` batches, or once the processes of
    the run have handed out `samples` samples between them (each its share)."""

    steps: int | None = None
    samples: int | None = None

    def reached(self, batches: int, samples: int, world_size: int) -> bool:
        if self.steps is not None:
            return batches >= self.steps
        return self.samples is not None and samples * world_size >= self.samples


@dataclass
class StepRecord:
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    sample_ids: list[Any] = field(default_factory=list)  # per step: [pass, indices] or None
    batch_prints: list[list[str]] = field(default_factory=list)  # per first step: data hashes
    saves: list[str] = field(default_factory=list)  # paths torch.save wrote
    writes: list[str] = field(default_factory=list)  # other paths opened for writing, once each
    # folders of the script's it made with `scratch` (left empty: their files went there)
    made_folders: list[str] = field(default_factory=list)
    write_sites: dict[str, str] = field(
        default_factory=dict
    )  # path -> `file:line` of the script's code
    printed: list[str] = field(default_factory=list)  # lines print wrote to the terminal
    printed_steps: list[int] = field(default_factory=list)  # the steps done when each was printed
    logged: list[list[Any]] = field(default_factory=list)  # [tag, value, steps done] per scalar
    log_sites: dict[str, str] = field(default_factory=dict)  # tag -> `file:line` that logged it
    param_digest: list[list[float]] = field(default_factory=list)  # per optimizer: [sum, abs sum]
    first_param_digest: list[list[float]] = field(default_factory=list)  # the same, at step 1
    # tensors an optimizer holds whose memory was let go (FSDP's whole parameters of a call)
    freed_parameters: int = 0
    # optimizers left out of the digests: built after the first step, never stepped on a
    # DataLoader's batch, on no DDP model (a linear probe each process fits alike)
    fits: int = 0
    end_time: float | None = None
    peak_rss_bytes: int | None = None
    peak_cuda_bytes: int | None = None
    device: str = "cpu"
    device_name: str = ""
    torch_version: str = ""
    threads: int = 0  # torch's intra-op threads
    rank: int = 0
    world_size: int = 1
    epochs_cut: int = 0  # training epochs `--epoch-steps`/`--epoch-samples` cut short
    epoch_samples: int | None = None  # the samples the first of them handed out
    exit: str = "ok"


def run_as_main(script: str, args: list[str], patches: ExitStack) -> str:
    """Run `script` as `__main__` with `args` inside `patches`; return how it ended:
    ``"ok"``, ``"max-steps"`` (a `StopScript`) or ``"error: ..."`` (``sys.exit(0)`` is ok)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        with patches:
            runpy.run_path(script, run_name="__main__")
    except StopScript:
        return "max-steps"
    except SystemExit as exc:
        if exc.code not in (None, 0):
            return f"error: SystemExit({exc.code!r})"
    except BaseException as exc:  # noqa: BLE001 - every failure is reported in the record
        traceback.print_exc()
        return f"error: {type(exc).__name__}: {exc}{_missing_bf16_kernel(exc)}"
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return "ok"


def _missing_bf16_kernel(exc: BaseException) -> str:
    """What a failure under forced autocast on a CPU means, when oneDNN had no bf16 kernel
    for a module (an ``nn.LSTM`` on a CPU without AVX-512): which module; "" otherwise.
    On CUDA, where converted scripts enable autocast, the module runs."""
    if os.environ.get(FORCE_AUTOCAST_ENV) != "1" or "primitive descriptor" not in str(exc):
        return ""
    import torch

    modules = [
        frame.f_locals["self"]
        for frame, _ in traceback.walk_tb(exc.__traceback__)
        if isinstance(frame.f_locals.get("self"), torch.nn.Module)
    ]
    where = type(modules[-1]).__name__ if modules else "an operation"
    return (
        f" [forced bf16 autocast: oneDNN has no bf16 kernel for {where} on this CPU's"
        " instruction set; converted scripts enable autocast on CUDA only, where it runs]"
    )


def seed_everything(seed: int) -> None:
    """Seed Python's, torch's and (when installed) NumPy's global generators."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of the first tensor found in it."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = batch_size(item)
            if size:
                return size
    return 0


class _StepRecorder:
    """The patches that record steps; `finish()` turns what they kept into a `StepRecord`."""

    def __init__(
        self,
        max_steps: int | None,
        progress: Path | None = None,
        scratch: Path | None = None,
        epoch_cut: EpochCut | None = None,
        script: str = "",
        batch_prints: bool = False,
    ) -> None:
        self.max_steps = max_steps
        self.fingerprints = batch_prints
        self.scratch = scratch
        self.epoch_cut = epoch_cut
        self.redirected: dict[str, str] = {}  # path the script wrote -> file in `scratch`
        self.folders = _WriteFolders.of([scratch, progress and progress.parent], script)
        self.record = StepRecord(
            rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1))
        )
        self.progress = progress if self.record.rank == 0 else None
        self.progress_written = 0.0
        self.loss_tensors: list[tuple[Any, Any]] = []  # (loss, scale or None), on the device
        self.samples_seen = 0
        self.last_batch = 0  # samples of the latest batch not yet counted by a step
        self.batch_step = False  # whether the latest step counted a batch
        self.last_ids: list[Any] | None = None  # [pass, indices] of that batch
        # samples of the batch a DataLoader handed out last, counted by its sampler's
        # indices (None for an IterableDataset's and for `batch_size=None`)
        self.latest_samples: int | None = None
        self.last_iterator: Any = None  # the DataLoader iterator that handed it out
        self.passes = 0  # DataLoader passes started so far
        self.optimizers: list[Any] = []  # every optimizer the script built
        self.wrapped: list[Any] = []  # every model the script wrapped in DDP
        # taken when the script ends its process group (FSDP's shards gather through it)
        self.digest: list[list[float]] | None = None
        self.stack = ExitStack()  # the patches, also those made once the script imports a logger
        self.unwatched = dict(_SCALAR_LOGGERS)  # scalar loggers not imported (nor patched) yet
        self.last_logged: logging.LogRecord | None = None  # its other handlers: kept already

    def patches(self, align_loader_rng: bool) -> ExitStack:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils.data import DataLoader, dataloader

        stack = self.stack
        self.batch_prints = BatchPrints() if self.fingerprints else None
        if self.batch_prints is not None:
            stack.callback(self.batch_prints.close)
        stack.enter_context(patched(torch.Tensor, "backward", self._backward))
        stack.enter_context(patched(torch.amp.GradScaler, "scale", _marking_scale))
        stack.enter_context(patched(dataloader._BaseDataLoaderIter, "__next__", self._next))
        stack.enter_context(patched(torch, "save", self._recording_save))
        for owner in (builtins, io):  # `Path.open` and `write_text` call `io.open`
            stack.enter_context(patched(owner, "open", self._recording_open))
        stack.enter_context(patched(builtins, "print", self._recording_print))
        stack.enter_context(patched(logging.Handler, "handle", self._recording_handled))
        stack.enter_context(patched(builtins, "__import__", self._watching_imports))
        self._watch_scalar_loggers()
        if self.scratch is not None:
            stack.enter_context(patched(torch, "load", self._redirected_load))
            # `os.makedirs` and `Path.mkdir` call it
            stack.enter_context(patched(os, "mkdir", self._recording_mkdir))
            for name in ("chmod", "utime"):  # `shutil.copy`, `copy2` set a copy's mode, times
                stack.enter_context(patched(os, name, self._redirected_path))
        stack.enter_context(patched(torch.optim.Optimizer, "__init__", self._kept_optimizer))
        stack.callback(register_optimizer_step_post_hook(self._stepped).remove)
        stack.enter_context(
            patched(torch.nn.parallel.DistributedDataParallel, "__init__", self._kept_wrapper)
        )
        stack.enter_context(patched(torch.distributed, "destroy_process_group", self._digest_first))
        stack.enter_context(patched(DataLoader, "__iter__", self._numbered_pass))
        stack.enter_context(
            patched(dataloader._BaseDataLoaderIter, "_next_index", self._kept_index)
        )
        if align_loader_rng:
            stack.enter_context(patched(DataLoader, "__iter__", _aligned_iter))
        if os.environ.get(FORCE_AUTOCAST_ENV) == "1":
            stack.enter_context(patched(torch.autocast, "__init__", _always_enabled))
        return stack

    def _backward(self, original: Callable) -> Callable:
        def backward(loss, *args, **kwargs):
            if loss.numel() == 1:
                self._record_step(loss)
            result = original(loss, *args, **kwargs)
            if self.max_steps is not None and len(self.record.times) >= self.max_steps:
                raise StopScript
            return result

        return backward

    def _record_step(self, loss: Any) -> None:
        # Only the latest batch counts, once, at the first backward after it was fetched:
        # a GAN's three backward calls share one batch, and the evaluation batches fetched
        # between two training steps are superseded by the next training batch.
        self.samples_seen += self.last_batch
        self.batch_step = self.last_batch > 0
        self.last_batch = 0
        if self.last_iterator is not None:
            vars(self.last_iterator)[_TRAINS_ATTR] = True
        self.loss_tensors.append((loss.detach().float().clone(), getattr(loss, _SCALE_ATTR, None)))
        now = time.perf_counter()
        self.record.times.append(now)
        self.record.samples.append(self.samples_seen)
        self.record.sample_ids.append(self.last_ids)
        self.last_ids = None
        if self.batch_prints is not None:
            self.batch_prints.step()
        steps = len(self.record.times)
        if steps == 1:
            self.record.first_param_digest = self._param_digest()
        last = steps == self.max_steps
        if self.progress is not None and (last or now - self.progress_written >= PROGRESS_INTERVAL):
            self.progress.write_text(str(steps))
            self.progress_written = now

    def _next(self, original: Callable) -> Callable:
        import torch

        def next_batch(iterator):
            # samples this pass of the iterator handed out (`_num_yielded`: torch's count,
            # 0 at the start of each pass, persistent workers' included)
            handed_out = vars(iterator).get(_EPOCH_SAMPLES_ATTR, 0) if iterator._num_yielded else 0
            if vars(iterator).get(_TRAINS_ATTR) and self._cut(iterator._num_yielded, handed_out):
                raise StopIteration
            batch = original(iterator)
            size = batch_size(batch)
            vars(iterator)[_EPOCH_SAMPLES_ATTR] = handed_out + size
            drawn = vars(iterator).get(_INDICES_ATTR)
            ids, self.latest_samples = drawn.popleft() if drawn else (None, None)
            if torch.is_grad_enabled():  # drawn under `no_grad()`: an evaluation's batch
                self.last_batch, self.last_ids, self.last_iterator = size, ids, iterator
            return batch

        return next_batch

    def _cut(self, batches: int, samples: int) -> bool:
        """Whether a training epoch that handed out `batches` batches of `samples` samples
        ends here (`epoch_cut`); counted in the record."""
        cut = self.epoch_cut is not None and self.epoch_cut.reached(
            batches, samples, self.record.world_size
        )
        if cut:
            self.record.epochs_cut += 1
            if self.record.epoch_samples is None:
                self.record.epoch_samples = samples
        return cut

    def _recording_save(self, original: Callable) -> Callable:
        """Record the path of every save; with `scratch`, write the file there instead."""

        def save(obj, f, *args, **kwargs):
            if not isinstance(f, (str, os.PathLike)):
                self.record.saves.append(repr(f))
                return original(obj, f, *args, **kwargs)
            self.record.saves.append(os.fspath(f))
            self._note_site(f)
            return original(obj, self._redirect(f), *args, **kwargs)

        return save

    def _note_site(self, path: str | os.PathLike, sites: dict[str, str] | None = None) -> None:
        """Keep in `sites` (`write_sites`) where the script's code wrote `path` (logged a
        tag) first: the innermost frame of the user's code (a helper of the project, not
        numpy's `save` nor matplotlib's `savefig`), as `file:line`."""
        frame = user_frame(sys._getframe(2))
        if frame is not None:
            where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
            (self.record.write_sites if sites is None else sites).setdefault(os.fspath(path), where)

    def _redirect(self, path: str | os.PathLike) -> str | os.PathLike:
        """Where a write to `path` goes: a file of its own in `scratch` (`path` without one)."""
        if self.scratch is None:
            return path
        wanted = os.path.abspath(path)
        name = wanted.strip(os.sep).replace(os.sep, "__")
        self.redirected[wanted] = str(self.scratch / f"rank{self.record.rank}-{name}")
        return self.redirected[wanted]

    def _recording_open(self, original: Callable) -> Callable:
        """Record every path opened for writing, outside the libraries' folders, and write it
        in `scratch`; a path written so reads back from there."""

        def open_(file, mode="r", *args, **kwargs):
            if not isinstance(file, (str, os.PathLike)):  # a file descriptor
                return original(file, mode, *args, **kwargs)
            wanted = os.path.abspath(file)
            if not _WRITE_MODES & set(mode) or not self.folders.the_scripts(wanted):
                return original(self.redirected.get(wanted, file), mode, *args, **kwargs)
            if os.fspath(file) not in self.record.writes:
                self.record.writes.append(os.fspath(file))
                self._note_site(file)
            redirected = self.redirected.get(wanted) or self._redirect(file)
            if "r" in mode and os.path.isfile(wanted) and not os.path.exists(redirected):
                shutil.copyfile(wanted, redirected)  # "r+": changes a copy
            return original(redirected, mode, *args, **kwargs)

        return open_

    def _redirected_path(self, original: Callable) -> Callable:
        """`original(path, ...)` changes the file in `scratch` that a write to `path` went to."""

        def change(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)):
                path = self.redirected.get(os.path.abspath(path), path)
            return original(path, *args, **kwargs)

        return change

    def _recording_mkdir(self, original: Callable) -> Callable:
        """Record each folder of the script's made (`run_script` removes it afterwards,
        empty: the files written into it went to `scratch`)."""

        def mkdir(path, *args, **kwargs):
            result = original(path, *args, **kwargs)
            if isinstance(path, (str, os.PathLike)):
                made = os.path.abspath(path)
                if self.folders.the_scripts(made):
                    self.record.made_folders.append(made)
            return result

        return mkdir

    def _recording_print(self, original: Callable) -> Callable:
        """Keep the lines printed to the terminal (not to a file)."""

        def print_(*args, sep=" ", end="\n", file=None, flush=False):
            if file in (None, sys.stdout, sys.stderr) and len(self.record.printed) < MAX_PRINTED:
                self._keep_lines((sep if sep is not None else " ").join(map(str, args)))
            return original(*args, sep=sep, end=end, file=file, flush=flush)

        return print_

    def _recording_handled(self, original: Callable) -> Callable:
        """Keep the message of each record the script's code logs that a handler formatted
        (into a log file, onto the terminal), once however many handlers did."""

        def handle(handler, record):
            handled = original(handler, record)
            message = getattr(record, "message", None)  # set by `Formatter.format`
            if message is not None and record is not self.last_logged:
                self.last_logged = record
                if is_user_file(record.pathname):
                    self._keep_lines(message)
            return handled

        return handle

    def _keep_lines(self, text: str) -> None:
        """Keep the lines of `text` in `printed`, up to `MAX_PRINTED` in all."""
        lines = text.splitlines()[: MAX_PRINTED - len(self.record.printed)]
        self.record.printed.extend(lines)
        self.record.printed_steps.extend([len(self.record.times)] * len(lines))

    def _watching_imports(self, original: Callable) -> Callable:
        """Patch a scalar logger once the script has imported its module."""

        def import_(*args, **kwargs):
            module = original(*args, **kwargs)
            if self.unwatched:
                self._watch_scalar_loggers()
            return module

        return import_

    def _watch_scalar_loggers(self) -> None:
        """Patch the methods of the scalar loggers whose module is imported by now (and
        done: a package's own imports find it half made), those its version has."""
        recorders = {
            "add_scalar": self._recording_scalar,
            "add_scalars": self._recording_scalars,
            "log": self._recording_scalar_dict,
        }
        for module, (name, methods) in list(self.unwatched.items()):
            owner = getattr(sys.modules.get(module), name, None)
            if owner is not None:
                del self.unwatched[module]
                for method in filter(functools.partial(hasattr, owner), methods):
                    self.stack.enter_context(patched(owner, method, recorders[method]))

    def _recording_scalar(self, original: Callable) -> Callable:
        def add_scalar(writer, tag, scalar_value, *args, **kwargs):
            self._keep_scalars({tag: scalar_value})
            return original(writer, tag, scalar_value, *args, **kwargs)

        return add_scalar

    def _recording_scalars(self, original: Callable) -> Callable:
        def add_scalars(writer, main_tag, tag_scalar_dict, *args, **kwargs):
            self._keep_scalars(tag_scalar_dict, f"{main_tag}/")
            return original(writer, main_tag, tag_scalar_dict, *args, **kwargs)

        return add_scalars

    def _recording_scalar_dict(self, original: Callable) -> Callable:
        def log(run, data, *args, **kwargs):
            self._keep_scalars(data)
            return original(run, data, *args, **kwargs)

        return log

    def _keep_scalars(self, values: Any, prefix: str = "") -> None:
        """Keep each number of the dict `values` (a tensor of one element too) with its tag
        (after `prefix`) and the steps done, up to `MAX_PRINTED` in all; images, histograms
        and the like are left out."""
        for tag, value in values.items() if isinstance(values, Mapping) else ():
            try:
                number = float(value)
            except (TypeError, ValueError, RuntimeError):
                continue
            if len(self.record.logged) < MAX_PRINTED:
                self.record.logged.append([f"{prefix}{tag}", number, len(self.record.times)])
                self._note_site(f"{prefix}{tag}", self.record.log_sites)

    def _redirected_load(self, original: Callable) -> Callable:
        """A file the script saved (into `scratch`) loads from there."""

        def load(f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):
                f = self.redirected.get(os.path.abspath(f)) or self._saved_by_another_rank(f) or f
            return original(f, *args, **kwargs)

        return load

    def _saved_by_another_rank(self, path: str | os.PathLike) -> str | None:
        """The file in `scratch` that another process saved `path` to (rank 0 saves the
        checkpoint every rank loads), None when none did."""
        if self.scratch is None:
            return None
        name = os.path.abspath(path).strip(os.sep).replace(os.sep, "__")
        saved = sorted(self.scratch.glob(f"rank*-{glob.escape(name)}"))
        return str(saved[0]) if saved else None

    def _kept_optimizer(self, original: Callable) -> Callable:
        def init(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            if not any(o is optimizer for o in self.optimizers):
                vars(optimizer)[_LATE_ATTR] = bool(self.record.times)
                self.optimizers.append(optimizer)

        return init

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.batch_step:
            vars(optimizer)[_ON_BATCHES_ATTR] = True

    def _fits(self, optimizer: Any, wrapped: set[int]) -> bool:
        """Whether `optimizer` fits a model of its own that no DDP model holds (`wrapped`:
        the ids of their parameters), built after training began and never stepped after a
        DataLoader's batch (SimCLR's L-BFGS linear probe on features every process computes
        alike): each process fits its own."""
        return (
            vars(optimizer).get(_LATE_ATTR, False)
            and not vars(optimizer).get(_ON_BATCHES_ATTR, False)
            and not any(
                id(p) in wrapped or hasattr(p, "full_tensor")
                for g in optimizer.param_groups
                for p in g["params"]
            )
        )

    def _kept_wrapper(self, original: Callable) -> Callable:
        def init(wrapper, module, *args, **kwargs):
            original(wrapper, module, *args, **kwargs)
            self.wrapped.append(module)

        return init

    def _digest_first(self, original: Callable) -> Callable:
        def destroy(*args, **kwargs):
            if self.digest is None:  # the first end of the group: what trained
                self.digest = self._param_digest()
            self.release()
            return original(*args, **kwargs)

        return destroy

    def release(self) -> None:
        """Let go of the script's optimizers and DDP models: held past the process group,
        FSDP's sharded parameters may abort the process at exit (see
        fully_sharded/destroy_after_models.py), also where the run stopped the script
        before it freed them itself."""
        self.optimizers.clear()
        self.wrapped.clear()
        gc.collect()

    def _param_digest(self) -> list[list[float]]:
        """Per optimizer, then per DDP-wrapped model (a manual update has no optimizer):
        the sum and the sum of absolute values of its parameters, in float64 (FSDP's
        sharded parameters gathered whole)."""
        import torch

        wrapped = {id(p) for module in self.wrapped for p in module.parameters()}
        compared = [o for o in self.optimizers if not self._fits(o, wrapped)]
        self.record.fits = max(self.record.fits, len(self.optimizers) - len(compared))
        groups = [[p for g in o.param_groups for p in g["params"]] for o in compared]
        groups += [list(module.parameters()) for module in self.wrapped]
        # reading a tensor whose storage FSDP resized to nothing crashes the process
        kept = [[p for p in params if _has_memory(p)] for params in groups]
        freed = sum(len(params) - len(held) for params, held in zip(groups, kept))
        self.record.freed_parameters = max(self.record.freed_parameters, freed)
        groups = kept
        with torch.no_grad():
            # a DTensor (FSDP's shard) whole: every rank gathers, in the same order
            tensors = [
                [getattr(p, "full_tensor", p.detach)().double() for p in params]
                for params in groups
            ]
            return [
                [sum(float(t.sum()) for t in group), sum(float(t.abs().sum()) for t in group)]
                for group in tensors
            ]

    def _numbered_pass(self, original: Callable) -> Callable:
        """Number every pass over a DataLoader, also one that reuses persistent workers."""

        def iterate(loader):
            self.passes += 1
            reused = loader._iterator  # set only for persistent workers
            if reused is not None:
                vars(reused).pop(_INDICES_ATTR, None)  # drawn ahead for a pass cut short
                setattr(reused, _PASS_ATTR, self.passes)
            iterator = original(loader)
            setattr(iterator, _PASS_ATTR, self.passes)
            return iterator

        return iterate

    def _kept_index(self, original: Callable) -> Callable:
        """Keep the indices a DataLoader iterator draws, in order, until `_next` hands
        out their batch (a new worker pool draws ahead before its pass is numbered)."""

        def next_index(iterator):
            index = original(iterator)
            indices = index if isinstance(index, list) else [index]
            if all(isinstance(i, int) for i in indices):
                ids = [getattr(iterator, _PASS_ATTR, self.passes), indices]
            else:  # an IterableDataset's `None`, or a sampler of its own kind
                ids = None
            samples = len(index) if isinstance(index, list) and ids is not None else None
            vars(iterator).setdefault(_INDICES_ATTR, deque()).append((ids, samples))
            return index

        return next_index

    def finish(self, exit_status: str) -> StepRecord:
        import torch

        record = self.record
        record.torch_version = torch.__version__
        record.threads = torch.get_num_threads()
        record.device_name = platform.processor() or platform.machine()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            record.device = "cuda"
            record.device_name = torch.cuda.get_device_name()
            record.peak_cuda_bytes = int(torch.cuda.max_memory_allocated())
        record.end_time = time.perf_counter()
        record.losses = [
            float(loss) / (float(scale) if scale is not None else 1.0)
            for loss, scale in self.loss_tensors
        ]
        record.peak_rss_bytes = _peak_rss_bytes()
        record.param_digest = self.digest if self.digest is not None else self._param_digest()
        record.batch_prints = self.batch_prints.prints if self.batch_prints is not None else []
        record.exit = exit_status
        return record


def _has_memory(tensor: Any) -> bool:
    """Whether `tensor`'s storage holds its elements (a DTensor's: its local shard's)."""
    local = getattr(tensor, "_local_tensor", tensor)
    if local.numel() == 0:
        return True
    last = local.storage_offset() + sum((n - 1) * s for n, s in zip(local.shape, local.stride()))
    return local.untyped_storage().nbytes() >= (last + 1) * local.element_size()


def _folders(*paths: str) -> tuple[str, ...]:
    return tuple(os.path.join(os.path.abspath(path), "") for path in paths)


@dataclass(frozen=True)
class _WriteFolders:
    """Which written files are the script's: none in the harness's or Python's folders; all in
    the current folder and the script's; none in the folders libraries write to (the
    temporary folder, caches, devices); all elsewhere."""

    never: tuple[str, ...]
    current: tuple[str, ...]
    libraries: tuple[str, ...]

    @classmethod
    def of(cls, ours: list[Path | None], script: str) -> _WriteFolders:
        """`ours`: the folders the harness writes to (the scratch folder, the progress file's);
        `script`: the script that runs (its folder is the script's, as the current one)."""
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        never = (
            sys.prefix,
            sys.base_prefix,
            *(str(folder) for folder in ours if folder is not None),
        )
        current = _folders(os.getcwd(), os.path.dirname(os.path.abspath(script)))
        return cls(
            _folders(*never), current, _folders(tempfile.gettempdir(), cache, "/dev", "/proc")
        )

    def the_scripts(self, path: str) -> bool:
        """Whether the absolute `path` is a file of the script's."""
        if path.startswith(self.never):
            return False
        return path.startswith(self.current) or not path.startswith(self.libraries)


def _marking_scale(original: Callable) -> Callable:
    def scale(scaler, outputs):
        import torch

        scaled = original(scaler, outputs)
        if isinstance(scaled, torch.Tensor) and scaler.is_enabled():
            scale_tensor = getattr(scaler, "_scale", None)  # a tensor: reading it needs no sync
            value = (
                scale_tensor.detach().clone() if scale_tensor is not None else scaler.get_scale()
            )
            setattr(scaled, _SCALE_ATTR, value)
        return scaled

    return scale


def _always_enabled(original: Callable) -> Callable:
    def init(region, device_type, dtype=None, enabled=True, cache_enabled=None):
        original(region, device_type, dtype, True, cache_enabled)

    return init


def _aligned_iter(original: Callable) -> Callable:
    def iterate(loader):
        import torch

        if loader.persistent_workers and loader.num_workers > 0 and loader._iterator is not None:
            # The seed a fresh iterator would have drawn (`_BaseDataLoaderIter.__init__`).
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        return original(loader)

    return iterate


def _peak_rss_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def record_steps(
    script: str,
    args: list[str],
    max_steps: int | None = None,
    seed: int | None = None,
    align_loader_rng: bool = False,
    progress: Path | None = None,
    scratch: Path | None = None,
    epoch_cut: EpochCut | None = None,
    batch_prints: bool = False,
) -> StepRecord:
    """Run `script` as `__main__` with `args` and record its training steps; with
    `scratch`, the files it writes go into that folder; with `epoch_cut`, training epochs
    end early."""
    if seed is not None:
        # seed + rank: the processes of a distributed run draw their own random numbers,
        # as unseeded processes do (torch seeds each from the OS), until a script seeds
        seed_everything(seed + int(os.environ.get("RANK", 0)))
    recorder = _StepRecorder(max_steps, progress, scratch, epoch_cut, script, batch_prints)
    patches = recorder.patches(align_loader_rng)
    facts = _fact_recorder(script, lambda: recorder.latest_samples)
    if facts is not None:  # entered last: its patches wrap the harness's
        patches.enter_context(facts[0].patches())
    exit_status = run_as_main(script, args, patches)
    record = recorder.finish(exit_status)
    if facts is not None:
        facts[0].write(facts[1], exit_status, len(record.times))
    recorder.release()
    _end_process_group()
    return record


def _fact_recorder(script: str, latest_batch: Callable[[], int | None]) -> Any:
    """`autoaccel.facts`' recorder and its output path, when ``AUTOACCEL_FACTS_OUT`` asks
    for facts (an environment variable, as `AUTOACCEL_FORCE_AUTOCAST`: it reaches the
    harness through `autoaccel.run.runner.run_script`); None otherwise."""
    from autoaccel.facts.recorder import recorder_from_env

    return recorder_from_env(script, latest_batch)


def _end_process_group() -> None:
    """Destroy a process group the script left open (stopped after `--max-steps`):
    gloo's threads abort the process at exit otherwise."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The harness's options, then the script and its own arguments, untouched: no option
    of the harness is abbreviated, so a script's `--epoch 3` is not taken for an ambiguous
    `--epoch-steps`/`--epoch-samples`."""
    parser = argparse.ArgumentParser(
        prog="python -m autoaccel.run.harness",
        description=__doc__.split("\n")[0],
        allow_abbrev=False,
    )
    parser.add_argument("--losses-out", required=True, help="JSON output path; {rank} is replaced")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N training steps")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed random, torch and numpy first (with seed + RANK)",
    )
    parser.add_argument(
        "--align-loader-rng", action="store_true", help="keep persistent loaders' RNG draws in step"
    )
    parser.add_argument("--progress", type=Path, default=None, help="write the step count here")
    parser.add_argument(
        "--batch-prints",
        action="store_true",
        help="fingerprint the data of the first steps (the proof's check of shared batches)",
    )
    parser.add_argument(
        "--scratch", type=Path, default=None, help="torch.save writes into this folder instead"
    )
    cut = parser.add_mutually_exclusive_group()
    cut.add_argument(
        "--epoch-steps", type=int, default=None, help="end training epochs after K batches"
    )
    cut.add_argument(
        "--epoch-samples",
        type=int,
        default=None,
        help="end training epochs after S samples, over all processes",
    )
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = arguments(argv)
    epoch_cut = (
        EpochCut(ns.epoch_steps, ns.epoch_samples) if ns.epoch_steps or ns.epoch_samples else None
    )
    record = record_steps(
        ns.script,
        ns.args,
        ns.max_steps,
        ns.seed,
        ns.align_loader_rng,
        ns.progress,
        ns.scratch,
        epoch_cut,
        ns.batch_prints,
    )
    out = Path(ns.losses_out.replace("{rank}", str(record.rank)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(record)))
    return 1 if record.exit.startswith("error") else 0


if __name__ == "__main__":
    sys.exit(main())
