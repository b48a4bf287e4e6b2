"""The parent side of a fact run: run the script for a few training steps under
`autoaccel.run.harness` in a child process (`autoaccel.run.runner.run_script`: a timeout,
a step limit, `torch.save` and `open(..., "w")` sent to a scratch folder) and load what
`autoaccel.facts.recorder` recorded there."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autoaccel.facts.model import RunFacts, Site
from autoaccel.facts.recorder import FACTS_ENV
from autoaccel.run.harness import EpochCut
from autoaccel.run.runner import Run, run_script

# Training steps (backward calls) a fact run takes: one whole step of a GAN (two
# discriminator backward calls and one of the generator) and the steps and zero_grads
# after it; more would only cost the script's time.
FACT_STEPS = 5
FACTS_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class FactsRequest:
    """A fact run: the script's arguments (those after `--`), steps and timeout."""

    script_args: list[str]
    steps: int = FACT_STEPS
    timeout: float = FACTS_TIMEOUT_S
    epoch_steps: int | None = None  # training epochs end after this many steps (a proof's run)


@dataclass
class FactsRun:
    """How a fact run went: its facts (None when it failed before any), the seconds it
    took, the end of its output when it failed, and the harness's record of it (the
    original's run that the proof of the conversion compares with)."""

    facts: RunFacts | None
    seconds: float
    error: str = ""
    run: Run | None = None


def collect_facts(
    script: Path, request: FactsRequest, import_from: list[Path] | None = None
) -> FactsRun:
    """Run `script` with `request.script_args` in the current folder for at most
    `request.steps` training steps; its writes go to a scratch folder removed afterwards."""
    started = time.perf_counter()
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with tempfile.TemporaryDirectory(prefix="autoaccel-facts-") as folder:
        scratch = Path(folder)
        out = scratch / "facts.json"
        run = run_script(
            script,
            request.script_args,
            request.steps,
            scratch / "records",
            import_from=import_from or [script.resolve().parent],
            env={**threads, FACTS_ENV: str(out)},
            timeout=request.timeout,
            scratch=scratch,
            epoch_cut=EpochCut(steps=request.epoch_steps) if request.epoch_steps else None,
            batch_prints=True,  # the proof's original run, where it is the same
        )
        seconds = time.perf_counter() - started
        if not out.is_file():
            return FactsRun(None, seconds, run.record.get("exit", "") + "\n" + run.log[-2000:], run)
        facts = RunFacts.load(out)
    error = "" if facts.ran_steps else f"{facts.exit}\n{run.log[-2000:]}"
    return FactsRun(facts, seconds, error, run)


def describe(facts: RunFacts) -> str:
    """What a run established, in a sentence: its steps, and which optimizer trained which
    model, made where."""
    texts: dict[str, str | None] = {}

    def shown(site: Site | None) -> str:
        if site is None:
            return "an unknown place"
        if site.path not in texts:
            try:
                texts[site.path] = Path(site.path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                texts[site.path] = None
        return site.shown(texts[site.path], Path.cwd())

    done = f"took {facts.steps} training step{'s' * (facts.steps != 1)}"
    parts = []
    for optimizer in facts.stepping_optimizers():
        models = [m for m in facts.modules if m.id in optimizer.roots]
        named = " and ".join(f"{m.cls.rpartition('.')[2]} made at {shown(m.site)}" for m in models)
        parts.append(
            f"the {optimizer.cls.rpartition('.')[2]} made at {shown(optimizer.site)} steps"
            f" {named or 'parameters of no module it made'}"
        )
    return f"{done}: " + "; ".join(parts) if parts else f"{done}, and no optimizer stepped"
