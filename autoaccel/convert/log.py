"""What a conversion did, and what it left alone and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Target = Literal["single", "dp", "ddp"]
Amp = Literal["bf16", "fp16", "off"]


@dataclass(frozen=True)
class ConvertOptions:
    target: Target = "single"
    amp: Amp = "bf16"
    compile: bool = False
    channels_last: bool = False


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


@dataclass
class ConversionLog:
    changes: list[Change] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
