"""Run a script under `autoaccel.harness` in its own process (or one per rank under
`torch.distributed.run`) and read back what it recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 0


@dataclass
class Run:
    record: dict[str, Any]  # the harness record (ranks merged)
    returncode: int
    log: str  # the script's output, stdout and stderr together

    @property
    def failed(self) -> bool:
        return self.returncode != 0 or self.record["exit"].startswith("error")


def harness_command(record_path: Path, steps: int, nproc: int | None) -> list[str]:
    """The command that starts the harness; with `nproc`, one process per rank."""
    launcher = [sys.executable]
    if nproc is not None:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [
        *launcher, "-m", "autoaccel.harness", "--losses-out", str(record_path),
        "--max-steps", str(steps), "--seed", str(SEED), "--align-loader-rng",
    ]


def run_script(
    script: Path,
    args: list[str],
    steps: int,
    records: Path,
    nproc: int | None = None,
    import_from: Path | None = None,
) -> Run:
    """Run `script args` for at most `steps` training steps, its records written into the
    empty folder `records`; `import_from` goes on the module search path (PYTHONPATH)."""
    env = {**os.environ, "PYTHONHASHSEED": str(SEED)}
    if import_from is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(import_from), env.get("PYTHONPATH")]))
    records.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [*harness_command(records / "record-{rank}.json", steps, nproc), str(script), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
    )
    ranks = [json.loads(path.read_text()) for path in sorted(records.glob("record-*.json"))]
    if not ranks:
        ranks = [{"losses": [], "times": [], "samples": [], "exit": f"error: exit code {proc.returncode}"}]
    return Run(merge_ranks(ranks), proc.returncode, proc.stdout)


def merge_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One record for a distributed run: losses averaged over the ranks (each rank's loss
    is the mean over its share of the batch), samples summed, peaks the largest, times
    and device from rank 0, and the first error of any rank."""
    ranks = sorted(ranks, key=lambda r: r.get("rank", 0))
    merged = dict(ranks[0])
    if len(ranks) == 1:
        return merged
    steps = min(len(r["losses"]) for r in ranks)
    merged["losses"] = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(steps)]
    merged["samples"] = [sum(r["samples"][i] for r in ranks) for i in range(steps)]
    merged["times"] = merged["times"][:steps]
    for peak in ("peak_rss_bytes", "peak_cuda_bytes"):
        values = [r[peak] for r in ranks if r.get(peak) is not None]
        merged[peak] = max(values) if values else None
    merged["exit"] = next((r["exit"] for r in ranks if r["exit"].startswith("error")), merged["exit"])
    return merged
