"""What a conversion did, and what it left alone and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Target = Literal["single", "dp", "ddp", "fsdp"]
# The targets whose result runs as several processes (torchrun).
MULTI_PROCESS: tuple[Target, ...] = ("ddp", "fsdp")
# The targets whose conversion may run the script for a few steps to learn what the code
# does not say (`autoaccel.facts`).
RUNS_THE_SCRIPT: tuple[Target, ...] = (*MULTI_PROCESS, "dp")
Amp = Literal["bf16", "fp16", "off"]
Launcher = Literal["torchrun", "slurm", "spawn"]
Workers = Literal["auto", "keep"]
# The proof's check that processes reading no DataLoader train on different data
# (`autoaccel.convert.verify`): it decides what a conversion cannot see, how each process
# draws its data.
DIFFERENT_DATA = "processes train on different data"
# Its check that the losses follow the original's: it decides a loss whose reduction
# depends on which branch runs (a summed CTC divided by the batch in one, a mean in the other).
LOSS_CLOSE = "loss close to the original's"


@dataclass(frozen=True)
class ConvertOptions:
    target: Target = "single"
    amp: Amp = "bf16"
    compile: bool = False
    channels_last: bool = False
    # DataLoader workers: "auto" sets them from the CPU count where the script loads in
    # the main process (ACC101); "keep" leaves `num_workers` as the script has it.
    workers: Workers = "auto"
    sync_bn: bool = False  # ddp: BatchNorm -> SyncBatchNorm
    per_process_batch: bool = False  # ddp: keep the batch size per process, not global
    launcher: Launcher = "torchrun"  # ddp: how the converted script is started
    cpu_offload: bool = False  # fsdp: parameters, gradients, optimizer state on the CPU


@dataclass(frozen=True)
class Change:
    """One applied rewrite; `line` is a line of the original file."""

    code: str
    line: int
    description: str


@dataclass(frozen=True)
class Skipped:
    """A rewrite that was not made, with the reason and what to do by hand."""

    what: str
    line: int | None
    reason: str
    # The result would train wrongly (or not at all) without it: `--to ddp` refuses to
    # write unless `--allow-partial`.
    wrong: bool = False
    # The check of the proof that tells whether it trains wrongly (`DIFFERENT_DATA`): where
    # the proof runs before writing, the check decides, not this refusal.
    proof: str = ""


def refusals(skipped: list[Skipped], proof_ahead: bool) -> list[Skipped]:
    """The skips that refuse a conversion: those that make it train wrongly, less those a
    check of the proof decides when the proof is `proof_ahead` (runs before the write)."""
    return [s for s in skipped if s.wrong and not (proof_ahead and s.proof)]


def left_to_proof(skipped: list[Skipped], proof_ahead: bool) -> list[Skipped]:
    """The skips a check of the proof ahead decides (see `refusals`)."""
    return [s for s in skipped if s.wrong and proof_ahead and s.proof]


@dataclass
class ConversionLog:
    changes: list[Change] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # How to run the result (e.g. torchrun commands), printed at the end of the report.
    launch: list[str] = field(default_factory=list)
    # Companion files (e.g. an sbatch script): name relative to the output's folder -> text.
    extra_files: dict[str, str] = field(default_factory=dict)
    # The processes share batches that no DataLoader makes by rounds (`ShardBatchRounds`):
    # the proof checks that each trains first on the original's batch at its rank.
    batch_rounds: bool = False
