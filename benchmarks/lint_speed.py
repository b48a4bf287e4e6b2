"""How fast is `autoaccel lint`? Builds a tree of realistic training code from the
fixtures (plus the non-torch modules a real project has), lints it in one process and
on all cores, times a one-file run of a 500-line script (what pre-commit does), and,
when given a TorchFix executable, runs TorchFix on the same tree.

    .venv/bin/python benchmarks/lint_speed.py [--torchfix /tmp/torchfix-venv/bin/torchfix]

"Per core" numbers divide files by CPU seconds (user + system), which stays honest on a
busy machine where wall time does not.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
AUTOACCEL = [sys.executable, "-m", "autoaccel"]

# Realistic modules without torch that live next to training scripts.
PLAIN_MODULES = [
    '''"""Command-line configuration for experiment {i}."""

import argparse
import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass
class Config{i}:
    data_dir: Path = Path("data")
    batch_size: int = {bs}
    learning_rate: float = 1e-3
    epochs: int = {i}
    seed: int = 42

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), default=str, indent=2))


def parse_args(argv=None) -> Config{i}:
    parser = argparse.ArgumentParser(description=__doc__)
    for field in dataclasses.fields(Config{i}):
        parser.add_argument(f"--{{field.name.replace('_', '-')}}", default=field.default)
    return Config{i}(**vars(parser.parse_args(argv)))
''',
    '''"""Running averages and timers used by the training loops."""

import logging
import time

log = logging.getLogger(__name__)


class AverageMeter{i}:
    def __init__(self, name, fmt=":f"):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / max(self.count, 1)

    def __str__(self):
        return ("{{name}} {{val" + self.fmt + "}} ({{avg" + self.fmt + "}})").format(**self.__dict__)


class Timer{i}:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.elapsed = time.perf_counter() - self.start
        log.debug("step took %.3f s", self.elapsed)
        return False
''',
    '''"""Download and unpack dataset shard {i}."""

import hashlib
import os
import tarfile
import urllib.request

URL = "https://example.org/shards/{i}.tar.gz"
SHA256 = "{sha}"


def sha256(path, chunk=1 << 20):
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(root="data"):
    os.makedirs(root, exist_ok=True)
    target = os.path.join(root, os.path.basename(URL))
    if not os.path.exists(target):
        urllib.request.urlretrieve(URL, target)
    if sha256(target) != SHA256:
        raise RuntimeError(f"checksum mismatch for {{target}}")
    with tarfile.open(target) as archive:
        archive.extractall(root)
    return root
''',
]


def build_tree(root: Path, training: int = 140, plain: int = 60) -> list[Path]:
    """`training` scripts made from the fixtures (1-3 of them per file, numbers and
    names varied) and `plain` non-torch modules."""
    fixtures = [p.read_text() for p in sorted(FIXTURES.glob("*.py"))]
    if not fixtures:
        raise SystemExit("no fixtures/*.py to build the tree from")
    files = []
    for i in range(training):
        parts = [fixtures[(i + k * 3) % len(fixtures)] for k in range(1 + i % 3)]
        text = "\n\n".join(parts)
        text = re.sub(r"\bbatch_size=(\d+)", lambda m: f"batch_size={int(m[1]) + i}", text)
        text = re.sub(r"\bclass (\w+)", rf"class \1V{i}", text)
        path = root / f"project{i % 10}" / f"train_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# experiment {i}\n{text}")
        files.append(path)
    for i in range(plain):
        template = PLAIN_MODULES[i % len(PLAIN_MODULES)]
        path = root / f"project{i % 10}" / "utils" / f"module_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(i=i, bs=32 + i, sha="0" * 64))
        files.append(path)
    return files


def training_script(path: Path, size: int, tail: tuple[str, ...] = ()) -> Path:
    """A `size`-line training script: the fixtures joined (as often as needed), cut at a
    top-level boundary, padded with assignments, then the `tail` lines."""
    fixtures = [p.read_text() for p in sorted(FIXTURES.glob("*.py"))]
    text = "\n\n".join(fixtures)
    copies = 2 + size // len(text.splitlines())
    lines = "\n\n".join([text] * copies).splitlines(keepends=True)
    room = size - len(tail)
    # Cut at the last top-level statement before line `room` that starts a def/class.
    cut = max(i for i, line in enumerate(lines[: room + 1]) if re.match(r"(def|class) ", line))
    body = lines[:cut]
    body += [f"x_{k} = {k}\n" for k in range(room - len(body))]
    path.write_text("".join(body + [f"{line}\n" for line in tail]))
    return path


# `Adam` imported by name: ACC505's fix rewrites the import too, so it asks which names
# the import binds and how often they are read.
ADAM_BY_NAME = ("from torch.optim import Adam", "opt = Adam(params, weight_decay=1e-4)")


def size_scaling(workdir: Path, sizes: list[int]) -> None:
    """`autoaccel lint FILE` in process on one file of each size: CPU time (median of 3)
    and the cost per line, which stays flat when the time is linear in the size."""
    sys.path.insert(0, str(ROOT))
    from autoaccel.lint.runner import Mode, Overrides, lint_file

    previous = None
    for size in sizes:
        script = training_script(workdir / f"script{size}.py", size, ADAM_BY_NAME)
        cpus = []
        for _ in range(3):
            start = time.process_time()
            lint_file(script, Overrides(), Mode.CHECK)
            cpus.append(time.process_time() - start)
        cpu = statistics.median(cpus)
        growth = (
            f"  x{cpu / previous[1]:.1f} time for x{size / previous[0]:.0f} lines"
            if previous
            else ""
        )
        print(
            f"lint, {size:6,}-line file: {cpu:6.2f} CPU-s  {1000 * cpu / size:5.2f} ms/line{growth}"
        )
        previous = (size, cpu)


def timed(
    command: list[str], cwd: Path | None = None
) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and child CPU seconds (user + system) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, run


def in_process_single(files: list[Path]) -> tuple[float, float, int]:
    """Every file linted one after another in this process (imports already warm)."""
    sys.path.insert(0, str(ROOT))
    from autoaccel.lint.runner import Mode, Overrides, lint_file

    lint_file(files[0], Overrides(), Mode.CHECK)  # warm the rule imports
    start_cpu, start = time.process_time(), time.perf_counter()
    findings = sum(len(lint_file(p, Overrides(), Mode.CHECK).diagnostics) for p in files)
    return time.perf_counter() - start, time.process_time() - start_cpu, findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchfix", help="path of a `torchfix` executable to compare with")
    parser.add_argument("--keep", action="store_true", help="keep the generated tree")
    parser.add_argument("--training", type=int, default=140, help="training scripts in the tree")
    parser.add_argument("--plain", type=int, default=60, help="non-torch modules in the tree")
    parser.add_argument(
        "--sizes",
        default="",
        help="also lint one file of each of these line counts (2000,8000,32000)",
    )
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="autoaccel-bench-"))
    tree = workdir / "tree"
    files = build_tree(tree, args.training, args.plain)
    torch_files = [p for p in files if "torch" in p.read_text()]
    lines = sum(len(p.read_text().splitlines()) for p in files)
    torch_lines = sum(len(p.read_text().splitlines()) for p in torch_files)
    cores = os.cpu_count() or 1
    print(
        f"machine: {platform.machine()} {platform.processor() or ''} {cores} cores,"
        f" Python {platform.python_version()}"
    )
    print(f"tree: {len(files)} files ({len(torch_files)} use torch), {lines} lines")

    wall, cpu, findings = in_process_single(files)
    print(
        f"autoaccel, 1 process : {wall:6.2f} s wall  {len(files) / wall:7.1f} files/s"
        f"  {lines / wall:8.0f} lines/s   ({len(files) / cpu:.1f} files per CPU-s;"
        f" {findings} findings)"
    )
    wall_t, cpu_t, _ = in_process_single(torch_files)
    print(
        f"  torch files only  : {wall_t:6.2f} s wall  {len(torch_files) / wall_t:7.1f} files/s"
        f"  {torch_lines / wall_t:8.0f} lines/s   ({len(torch_files) / cpu_t:.1f} files per CPU-s)"
    )

    wall_all, cpu_all, run = timed([*AUTOACCEL, "lint", "--exit-zero", "-q", str(tree)])
    assert run.returncode == 0, run.stderr
    print(
        f"autoaccel, {cores} cores  : {wall_all:6.2f} s wall  {len(files) / wall_all:7.1f} files/s"
        f"  {lines / wall_all:8.0f} lines/s   (CLI, start-up included; {cpu_all:.1f} CPU-s)"
    )

    script = training_script(workdir / "script500.py", 500)
    walls, cpus = [], []
    for _ in range(5):
        one_wall, one_cpu, run = timed([*AUTOACCEL, "lint", "--exit-zero", "-q", str(script)])
        assert run.returncode == 0, run.stderr
        walls.append(one_wall)
        cpus.append(one_cpu)
    print(
        f"one 500-line file    : {statistics.median(walls):.2f} s wall,"
        f" {statistics.median(cpus):.2f} CPU-s (median of 5, start-up included;"
        f" target < 0.5 s)"
    )

    if args.sizes:
        size_scaling(workdir, [int(size) for size in args.sizes.split(",")])

    if args.torchfix:
        tf_wall, tf_cpu, run = timed([args.torchfix, "--select", "ALL", "-j", "1", str(tree)])
        print(
            f"TorchFix, 1 job      : {tf_wall:6.2f} s wall  {len(files) / tf_wall:7.1f} files/s"
            f"  {lines / tf_wall:8.0f} lines/s   ({len(files) / tf_cpu:.1f} files per CPU-s;"
            f" exit {run.returncode}, {len(run.stdout.splitlines())} findings)"
        )
        tf_wall_t, tf_cpu_t, _ = timed(
            [args.torchfix, "--select", "ALL", "-j", "1", *map(str, torch_files)]
        )
        print(
            f"  torch files only  : {tf_wall_t:6.2f} s wall"
            f"  {len(torch_files) / tf_wall_t:7.1f} files/s"
        )
        print(
            f"ratio per core (autoaccel / TorchFix, 1 process each), by wall time: all files"
            f" {tf_wall / wall:.1f}x, torch files only {tf_wall_t / wall_t:.1f}x;"
            f" by CPU time: all files {tf_cpu / cpu:.1f}x, torch files only {tf_cpu_t / cpu_t:.1f}x"
        )
        tf_one, tf_one_cpu, _ = timed([args.torchfix, "--select", "ALL", "-j", "1", str(script)])
        print(f"TorchFix one 500-line file: {tf_one:.2f} s wall, {tf_one_cpu:.2f} CPU-s")

    if args.keep:
        print(f"tree kept in {tree}")
    else:
        shutil.rmtree(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
