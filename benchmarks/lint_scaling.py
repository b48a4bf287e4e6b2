"""Do lint time and memory grow linearly with the file size, up to the size limit?

`autoaccel lint FILE` in a child process on generated files of 100 KB, 300 KB and the
largest size autoaccel reads (`MAX_SOURCE_BYTES`), of four kinds: dense training code
(the fixtures joined), PyTorch's own sources joined (when torch is installed), one line
of statements, and a comment followed by a million `\\r` line breaks. For each: CPU
seconds (user + system) and the child's peak memory (max RSS, from `os.wait4`), each
also per MiB: flat per-MiB columns mean linear growth.

    .venv/bin/python benchmarks/lint_scaling.py

Writes benchmarks/results/lint_scaling.md and .json.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

from autoaccel.fileio import MAX_SOURCE_BYTES  # noqa: E402

SIZES = (100_000, 300_000, MAX_SOURCE_BYTES)


def training_code(size: int) -> str:
    """The fixtures joined as often as needed, cut at a top-level `def`/`class`."""
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "fixtures").glob("*.py")))
    text = "\n\n".join([text] * (2 + size // len(text)))
    return text[: text.rfind("\ndef ", 0, size) + 1]


def torch_sources(size: int) -> str | None:
    """PyTorch's own modules joined (without `from __future__` lines, which only a
    module's start may hold); None without torch installed."""
    spec = importlib.util.find_spec("torch")  # not imported: the children fork from here
    if spec is None or spec.origin is None:
        return None
    future = re.compile(r"^from __future__ import [^\n]*\n", re.M)
    parts, total = [], 0
    for path in sorted(Path(spec.origin).parent.rglob("*.py")):
        text = future.sub("", path.read_text(errors="replace"))
        if "\r" in text or not text.endswith("\n") or total + len(text.encode()) > size:
            continue
        try:
            compile(text, str(path), "exec", flags=0x400, dont_inherit=True)  # ast only
        except (SyntaxError, ValueError):
            continue
        parts.append(text)
        total += len(text.encode())
        if total > 0.97 * size:
            break
    return "".join(parts)


def one_line(size: int) -> str:
    statements = (f"a{i} = torch.zeros({i})" for i in range(size))
    line, total = [], len("import torch\n\n")
    for statement in statements:
        total += len(statement) + 2
        if total > size:
            break
        line.append(statement)
    return "import torch\n" + "; ".join(line) + "\n"


def carriage_returns(size: int) -> str:
    return "torch  #" + "\r" * (size - len("torch  #"))


KINDS = {
    "training code": training_code,
    "torch sources": torch_sources,
    "one line": one_line,
    "comment + \\r": carriage_returns,
}


def lint(path: Path) -> tuple[float, float, int]:
    """CPU seconds, peak RSS in MiB and exit code of `autoaccel lint path`."""
    child = subprocess.Popen(
        [sys.executable, "-m", "autoaccel", "lint", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=path.parent,
    )
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, child.returncode


def cpu_model() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for kind, make in KINDS.items():
            for size in SIZES:
                text = make(size)
                if text is None:
                    continue
                path = Path(folder) / "script.py"
                path.write_text(text, newline="")
                nbytes = path.stat().st_size
                cpu, rss, code = lint(path)
                row = {
                    "kind": kind,
                    "bytes": nbytes,
                    "cpu_s": round(cpu, 2),
                    "max_rss_mib": round(rss),
                    "exit_code": code,
                }
                rows.append(row)
                mib = nbytes / 2**20
                print(
                    f"{kind:14} {nbytes:>9,} B  {cpu:6.2f} CPU-s {cpu / mib:5.1f}/MiB  "
                    f"{rss:6.0f} MiB RSS {rss / mib:6.0f}/MiB  exit {code}",
                    flush=True,
                )
    machine = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "limit_bytes": MAX_SOURCE_BYTES,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "lint_scaling.json").write_text(
        json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n"
    )
    (RESULTS / "lint_scaling.md").write_text(markdown(machine, rows))
    return 0


def markdown(machine: dict, rows: list[dict]) -> str:
    lines = [
        f"# lint scaling — {machine['date']}",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores (shared), Python {machine['python']}. "
        f"`autoaccel lint FILE` in a child process, one run each; CPU-s = user + system, "
        f"RSS = the child's peak. Size limit: {machine['limit_bytes']:,} bytes (1 MiB).",
        "",
        "| kind | bytes | CPU-s | CPU-s per MiB | peak RSS (MiB) | RSS per MiB | exit |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        mib = row["bytes"] / 2**20
        lines.append(
            f"| {row['kind']} | {row['bytes']:,} | {row['cpu_s']:.2f} | {row['cpu_s'] / mib:.1f} "
            f"| {row['max_rss_mib']} | {row['max_rss_mib'] / mib:.0f} | {row['exit_code']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
