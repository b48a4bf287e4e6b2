"""The GPU evidence of issue 5, in one run on a GPU machine:

- `autoaccel bench` of the two GPU-sized workloads (`--size gpu`), original against
  `--to single --amp bf16`, with and without `--compile` and `--channels-last`;
- `autoaccel tune` on the CPU-heavy loader of `resnet_cifar.py`;
- the converted ResNet (bf16, compile, channels_last) against the hand-tuned
  `benchmarks/expert/resnet_cifar_expert.py --compile`: the ratio of their samples/s.

    .venv/bin/python benchmarks/gpu_bench.py [--steps 150] [--warmup 20] [--repeats 1] [--out DIR]

150 steps stay inside the first epoch at `--size gpu` (195 steps): a window that crosses
it times the first evaluation pass, which under `--compile` compiles a second graph.
One repeat per bench fits the whole run in a lent machine's 15 minutes (3 repeats of a
bench took about 3 minutes on an H200).

Writes into benchmarks/results/<device>/ (or --out): a folder per bench (bench.json,
bench.png, index.html), tune-resnet_cifar.json, expert.json and summary.md, the table for
the README. Without CUDA it stops, unless --allow-cpu (a smoke test: --size tiny).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from autoaccel.bench.compare import throughput
from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.run.runner import run_script

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
EXPERT = ROOT / "benchmarks" / "expert" / "resnet_cifar_expert.py"
AUTOACCEL = [sys.executable, "-m", "autoaccel"]
# Most telling first: a run cut short by its machine's time limit keeps these.
MATRIX = [
    ("resnet_cifar", ()),
    ("transformer_lm", ()),
    ("resnet_cifar", ("--compile", "--channels-last")),
    ("transformer_lm", ("--compile",)),
    ("resnet_cifar", ("--channels-last",)),
    ("resnet_cifar", ("--compile",)),
]


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def bench(workload: str, options: tuple[str, ...], script_args: list[str], ns, out: Path) -> dict:
    name = "-".join([workload, "bf16", *(o.strip("-") for o in options)])
    command = [
        *AUTOACCEL,
        "bench",
        str(FIXTURES / f"{workload}.py"),
        "--to",
        "single",
        "--amp",
        "bf16",
        *options,
        "--steps",
        str(ns.steps),
        "--warmup",
        str(ns.warmup),
        "--repeats",
        str(ns.repeats),
        "--report",
        str(out / name),
        "--json",
        "--",
        *script_args,
    ]
    print("$", " ".join(command[2:]), flush=True)
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"name": name, "error": proc.stderr[-500:]}
    return {"name": name, **json.loads(proc.stdout)}


def expert_ratio(script_args: list[str], ns) -> dict:
    """Samples/s of the converted fixture over those of the hand-tuned script."""
    options = ConvertOptions(amp="bf16", compile=True, channels_last=True)
    source = (FIXTURES / "resnet_cifar.py").read_text()
    speeds = {}
    with tempfile.TemporaryDirectory() as folder:
        converted = Path(folder) / "resnet_cifar.py"
        converted.write_text(convert_source(source, options).converted)
        runs = {
            "converted": (converted, script_args),
            "expert": (EXPERT, [*script_args, "--compile"]),
        }
        for name, (script, args) in runs.items():
            run = run_script(
                script, args, ns.steps, Path(folder) / f"records-{name}", import_from=[FIXTURES]
            )
            speed = throughput(run.record, ns.warmup)
            speeds[name] = speed.samples_per_s if speed and not run.failed else None
    ratio = speeds["converted"] / speeds["expert"] if all(speeds.values()) else None
    return {"samples_per_s": speeds, "converted_over_expert": ratio}


def summary(device: str, results: list[dict], expert: dict) -> str:
    date = datetime.date.today().isoformat()
    lines = [
        f"# autoaccel bench on {device} ({date}, torch {torch.__version__})",
        "",
        "| workload | conversion | original samples/s | converted samples/s | speed-up | max loss difference | agree |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['name']} | failed | | | | | |")
            continue
        runs = result["runs"]
        difference = result["max_rel_diff"]
        lines.append(
            f"| {Path(result['script']).stem} | {result['command'].split(' --steps')[0]} "
            f"| {runs['original']['samples_per_s'] or 0:,.0f} | {runs['converted']['samples_per_s'] or 0:,.0f} "
            f"| {result['speedup'] or 0:.2f}x ({result['speed']}) "
            f"| {'-' if difference is None else f'{difference:.2%}'} "
            f"| {'yes' if result['agree'] else 'NO'} |"
        )
    ratio = expert["converted_over_expert"]
    lines += [
        "",
        f"Converted ResNet over the hand-tuned one: {'-' if ratio is None else f'{ratio:.2f}'} (samples/s).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--size", default="gpu", help="the workloads' --size (tiny for a smoke test)"
    )
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per bench")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--allow-cpu", action="store_true", help="run without CUDA (smoke test)")
    ns = parser.parse_args()
    if not torch.cuda.is_available() and not ns.allow_cpu:
        print("no CUDA device: this is the GPU benchmark (use --allow-cpu --size tiny to try it)")
        return 2
    device = device_name()
    out = ns.out or ROOT / "benchmarks" / "results" / slug(device)
    out.mkdir(parents=True, exist_ok=True)
    script_args = ["--size", ns.size, "--epochs", "3"]

    results: list[dict] = []
    expert: dict = {"converted_over_expert": None}
    for index, (workload, options) in enumerate(MATRIX):
        results.append(bench(workload, options, script_args, ns, out))
        if index == 2:  # the expert comparison belongs with the fastest conversion, just run
            expert = expert_ratio(script_args, ns)
            (out / "expert.json").write_text(json.dumps(expert, indent=2) + "\n")
        (out / "summary.md").write_text(summary(device, results, expert))
    tune = subprocess.run(
        [*AUTOACCEL, "tune", str(FIXTURES / "resnet_cifar.py"), "--json", "--", *script_args],
        capture_output=True,
        text=True,
    )
    (out / "tune-resnet_cifar.json").write_text(
        tune.stdout or json.dumps({"error": tune.stderr[-3000:]})
    )
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
