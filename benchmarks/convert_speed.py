"""How fast are `autoaccel convert --to ddp` and `autoaccel lint` on one file, and do
they stay linear in its size? Builds 500 / 2,000 / 8,000-line training scripts and
times both in process (CPU time, best of `--repeat` runs: the machine may be shared;
imports excluded).

    .venv/bin/python benchmarks/convert_speed.py [--sizes 500,2000,8000] [--repeat 3]
        [--checkout /tmp/autoaccel-old]   # time another checkout (e.g. a git worktree)

Each script is `fixtures/resnet_cifar.py` (argparse, a ResNet, a Dataset, `main()`)
with the model, dataset and loss classes of the other fixtures inserted before its own
classes, renamed apart, until the size is reached: one program that trains once, with
the library code a long script carries. Its conversion does what the fixture's does.

"floor" is what a conversion costs before any of its steps runs: the lint-rule fixes it
applies and Black's safety check (parse and compile the output, then fix it again and find
nothing to change), timed with the same fixes alone.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
BASE = "resnet_cifar.py"


def library_classes() -> list[tuple[str, str]]:
    """(name, code) of every top-level class of the fixtures but the base's and the
    trainers (whose methods train: a second training program)."""
    classes = []
    for path in sorted(FIXTURES.glob("*.py")):
        if path.name == BASE:
            continue
        module = cst.parse_module(path.read_text())
        for statement in module.body:
            if isinstance(statement, cst.ClassDef) and "Trainer" not in statement.name.value:
                classes.append((statement.name.value, module.code_for_node(statement)))
    return classes


def training_script(size: int) -> str:
    """A script of about `size` lines (see the module docstring)."""
    import re

    lines = (FIXTURES / BASE).read_text().splitlines(keepends=True)
    first_class = next(i for i, line in enumerate(lines) if line.startswith("class "))
    room = size - len(lines)
    inserted, classes = [], library_classes()
    for number in range(10**6):
        name, code = classes[number % len(classes)]
        block = re.sub(rf"\b{name}\b", f"{name}V{number}", code) + "\n\n"
        if block.count("\n") > room:
            break
        inserted.append(block)
        room -= block.count("\n")
    return "".join(lines[:first_class] + inserted + lines[first_class:])


def cpu_best(function, repeat: int) -> float:
    """The least CPU time of `repeat` calls of `function`: other load only adds."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        function()
        times.append(time.process_time() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500,2000,8000", help="line counts of the scripts")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best)")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the autoaccel tree to time")
    parser.add_argument("--no-convert", action="store_true", help="time lint only")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(args.checkout.resolve()))
    from autoaccel.config import LintSettings
    from autoaccel.convert.log import ConvertOptions
    from autoaccel.convert.pipeline import check_compiles, convert_source
    from autoaccel.convert.transforms.rule_fixes import SingleProcessFixes
    from autoaccel.source import parse
    from autoaccel.lint.fixer import fix_source
    from autoaccel.lint.runner import Mode, Overrides, lint_file
    from autoaccel.module_code import ModuleCode

    fixes = LintSettings(
        select=SingleProcessFixes.codes, extend_safe_fixes=SingleProcessFixes.speed_ups
    )

    def floor(text: str, path: str) -> None:
        module_code = ModuleCode()
        fixed = fix_source(text, fixes, module=parse(text), module_code=module_code).source
        output = check_compiles(fixed, path)
        assert fix_source(fixed, fixes, module=output, module_code=module_code).source == fixed

    print(
        f"machine: {platform.machine()}, Python {platform.python_version()}, checkout {args.checkout}"
    )
    workdir = Path(tempfile.mkdtemp(prefix="autoaccel-convert-bench-"))
    ddp = ConvertOptions(target="ddp")
    previous = None
    for size in (int(size) for size in args.sizes.split(",")):
        text = training_script(size)
        lines = len(text.splitlines())
        path = workdir / f"train_{size}.py"
        path.write_text(text)
        lint_file(path, Overrides(), Mode.CHECK)  # warm the rule imports
        lint = cpu_best(lambda: lint_file(path, Overrides(), Mode.CHECK), args.repeat)
        row = f"{lines:6,} lines  lint {lint:6.2f} CPU-s ({1000 * lint / lines:.2f} ms/line)"
        if not args.no_convert:
            least = cpu_best(lambda: floor(text, str(path)), args.repeat)
            row += f"  floor {least:6.2f} CPU-s ({least / lint:.1f}x lint)"
            conversions = []
            convert = cpu_best(
                lambda: conversions.append(convert_source(text, ddp, str(path))), args.repeat
            )
            assert conversions[0].changed and not any(s.wrong for s in conversions[0].log.skipped)
            row += (
                f"  convert --to ddp {convert:6.2f} CPU-s ({1000 * convert / lines:.2f} ms/line,"
                f" {convert / lint:.1f}x lint)"
            )
            if previous:
                row += f"  x{convert / previous[1]:.1f} time for x{lines / previous[0]:.1f} lines"
            previous = (lines, convert)
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
