"""`bench --to fsdp`: the peak memory per rank of the same script under `--to ddp`, the
baseline FSDP exists to beat (DDP holds the whole model, its gradients and optimizer
state on every rank; FSDP a 1/WORLD_SIZE share of each)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.fileio import read_source, write_atomic
from autoaccel.run.runner import run_script

PEAKS = ("peak_rss_bytes", "peak_cuda_bytes")


def ddp_peaks(
    script: Path,
    args: list[str],
    options: ConvertOptions,
    steps: int,
    nproc: int | None,
    threads: str | None,
) -> dict[str, Any] | None:
    """The largest rank's peaks (RSS, and CUDA on GPUs) of one run of the `--to ddp`
    conversion with the other options kept; None when it does not convert or run."""
    try:
        conversion = convert_source(
            read_source(script).text, replace(options, target="ddp", cpu_offload=False), str(script)
        )
    except Exception:  # noqa: BLE001 - a missing baseline leaves the line out, nothing more
        return None
    with tempfile.TemporaryDirectory(prefix="autoaccel-bench-ddp-") as folder:
        copy = Path(folder) / "ddp" / script.name
        copy.parent.mkdir()
        write_atomic(copy, conversion.converted)
        run = run_script(
            copy,
            args,
            steps,
            Path(folder) / "records",
            nproc,
            import_from=[script.resolve().parent],
            env={"OMP_NUM_THREADS": threads} if threads else {},
        )
    return None if run.failed else {peak: run.record[peak] for peak in PEAKS}
