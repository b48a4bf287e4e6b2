"""Fuzzing, bounded: random bytes, mutated training scripts, deep nesting and random
notebook JSON through `lint` (check and fix) and `convert`. Every case must end in a
report or a `path: message` error, never a traceback, a crash or a hang (issue 19).

The cases run in one child process (`python tests/test_fuzz.py SEED COUNT`), so that a
crash in native code fails the test instead of killing pytest; a case is reproduced
from its seed alone.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SEED, COUNT = 19, 30
SCRIPT = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(dataset, batch_size=32, shuffle=True)
for epoch in range(3):
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
torch.save(model.state_dict(), "model.pt")
"""
PIECES = [
    "(",
    ")",
    "[",
    "]",
    ":",
    ",",
    "\n",
    "\r\n",
    "\r",
    "\f",
    "\t",
    "    ",
    "\\\n",
    "#",
    '"',
    "'''",
    "lambda: ",
    "not ",
    " and ",
    ".cuda()",
    "torch",
    "\x00",
    "\u2028",
    "é",
    "await ",
]
# (opening, closing) of one nesting level: LibCST recursed once per level.
LEVELS = [
    ("(", ")"),
    ("[", "]"),
    ("-", ""),
    ("not ", ""),
    ("a + ", ""),
    ("a and ", ""),
    ("lambda: ", ""),
    ("f(", ")"),
    ("a if b else ", ""),
    ("", ".b"),
]


def random_bytes(rng: random.Random) -> bytes:
    size = rng.randrange(200)
    if rng.random() < 0.5:
        data = rng.randbytes(size)
    else:  # mostly printable: gets past the decoder to the tokenizer
        data = "".join(
            rng.choice(PIECES + list("abc=+-*/ 0123456789")) for _ in range(size)
        ).encode()
    return (b"import torch\n" + data) if rng.random() < 0.7 else data


def mutated_script(rng: random.Random) -> bytes:
    """Line edits (which mostly keep it Python) and character edits (which mostly not)."""
    lines = SCRIPT.splitlines(keepends=True)
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(len(lines) + 1)
        edit = rng.randrange(6)
        if edit == 0:
            lines.insert(at, rng.choice(SCRIPT.splitlines(keepends=True)))
        elif edit == 1 and at < len(lines):
            del lines[at]
        elif edit == 2:
            lines.insert(at, rng.choice(["\f\n", "# note\n", "\n", "x = 1  # noqa\n"]))
        elif edit == 3 and at < len(lines):
            lines[at] = "\f" + lines[at]
        elif edit == 4:
            lines = [line.replace("\n", rng.choice(["\r\n", "\r"])) for line in lines]
        else:
            text = "".join(lines)
            spot = rng.randrange(len(text) + 1)
            lines = [text[:spot] + rng.choice(PIECES) + text[spot:]]
    return "".join(lines).encode("utf-8", "surrogatepass")


def deep_nesting(rng: random.Random) -> bytes:
    depth = rng.randrange(100, 3000)
    if rng.random() < 0.7:  # one kind of level: Python accepts it, up to its own limits
        levels = [rng.choice(LEVELS)] * depth
    else:
        levels = [rng.choice(LEVELS) for _ in range(depth)]
    core = "".join(o for o, _ in levels) + "a" + "".join(c for _, c in reversed(levels))
    statement = rng.choice([f"x = {core}", f"import a{'.b' * len(levels)}", f"print({core})"])
    return f"{SCRIPT}{statement}\n".encode()


def random_json(rng: random.Random, depth: int = 0) -> object:
    kinds = ["str", "int", "null", "bool", "list", "dict"] if depth < 4 else ["str", "int"]
    kind = rng.choice(kinds)
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == "dict":
        keys = [
            "cells",
            "metadata",
            "source",
            "cell_type",
            "language_info",
            "kernelspec",
            "name",
            "x",
        ]
        return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(4))}
    return {"str": "import torch\n", "int": 3, "null": None, "bool": True}[kind]


def random_notebook(rng: random.Random) -> bytes:
    cell = {
        "cell_type": "code",
        "metadata": {},
        "outputs": [],
        "execution_count": None,
        "source": SCRIPT.splitlines(keepends=True),
    }
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    choice = rng.randrange(4)
    if choice == 0:  # a value of the wrong type somewhere
        target = rng.choice([notebook, cell, notebook["metadata"]])
        target[rng.choice(["cells", "metadata", "source", "cell_type", "language_info"])] = (
            random_json(rng)
        )
    elif choice == 1:
        notebook = random_json(rng)
    elif choice == 2:
        cell["source"] = mutated_script(rng).decode("utf-8", "replace")
    else:
        return ("[" * rng.randrange(500, 200_000)).encode()
    text = json.dumps(notebook, indent=rng.choice([None, 1]))
    return text.encode() if rng.random() < 0.8 else text.encode()[: rng.randrange(len(text) + 1)]


GENERATORS = [random_bytes, mutated_script, deep_nesting, random_notebook]
LINT_ERROR = re.compile(r"(\d+:\d+|cell \d+:\d+:\d+): ")


def run_case(seed: int, folder: Path) -> str | None:
    """Lint, fix and convert one generated file; a description of what went wrong."""
    from autoaccel.convert.command import run_convert
    from autoaccel.convert.log import ConvertOptions
    from autoaccel.lint.runner import Mode, Overrides, lint_file

    rng = random.Random(seed)
    generator = rng.choice(GENERATORS)
    suffix = ".ipynb" if generator is random_notebook else ".py"
    path = folder / f"case{seed}{suffix}"
    path.write_bytes(generator(rng))
    for mode in (Mode.CHECK, Mode.FIX):
        result = lint_file(path, Overrides(unsafe_fixes=True), mode)
        if result.error is not None and not LINT_ERROR.match(result.error):
            return f"lint {mode.value}: unlocated error {result.error!r}"
    target = "single" if suffix == ".ipynb" else rng.choice(["single", "dp", "ddp"])
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        code = run_convert(path, ConvertOptions(target=target), output=folder / f"out{suffix}")
    lines = stderr.getvalue().splitlines()
    if code not in (0, 2) or not all(line.startswith(str(path)) for line in lines[:1]):
        return f"convert --to {target}: exit {code}, stderr {stderr.getvalue()[:300]!r}"
    return None


def main(seed: int, count: int) -> int:
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        for case in range(seed, seed + count):
            print(f"case {case}", flush=True)  # the last one printed is the one that crashed
            try:
                problem = run_case(case, Path(folder))
            except Exception as error:  # noqa: BLE001 - the finding this test looks for
                problem = f"{type(error).__name__}: {error}"
            if problem:
                failures += 1
                print(f"FAILED case {case}: {problem}", flush=True)
    return 1 if failures else 0


def test_random_inputs_end_in_a_report_or_an_error():
    run = subprocess.run(
        [sys.executable, __file__, str(SEED), str(COUNT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
