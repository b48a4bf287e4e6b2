"""Helpers for tests that convert fixtures and run them (a plain module, imported by tests).

`convert` runs `autoaccel convert` in a subprocess, `run_with_losses` runs a script under
`autoaccel.harness` and returns the loss of every backward call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
TIMEOUT_S = 120


def fixture_names() -> list[str]:
    """The fixture scripts, sorted (hidden files, e.g. an editor's, are not fixtures)."""
    return sorted(p.name for p in FIXTURES_DIR.glob("*.py") if not p.name.startswith("."))


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # One intra-op thread: the scripts are tiny, and several run side by side on 2 cores.
    return {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", **(extra or {})}


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        raise AssertionError(
            f"{what} exited with {proc.returncode}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"
        )


def run_with_losses(script_path, args, tmp_path, env=None, max_steps=None) -> list[float]:
    """Run `script_path args...` under the harness in `tmp_path`; return the recorded losses."""
    out = Path(tmp_path) / f"losses-{Path(script_path).stem}.json"
    cmd = [sys.executable, "-m", "autoaccel.harness", "--losses-out", str(out)]
    if max_steps is not None:
        cmd += ["--max-steps", str(max_steps)]
    cmd += [str(script_path), *map(str, args)]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=_env(env), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    _check(proc, f"harness run of {Path(script_path).name}")
    return json.loads(out.read_text())["losses"]


def convert(fixture, tmp_path, *options: str) -> Path:
    """`autoaccel convert FIXTURE -o OUT *options`; returns OUT (a file in `tmp_path`)."""
    fixture = Path(fixture)
    if not fixture.is_absolute():
        fixture = FIXTURES_DIR / fixture
    tag = "".join(o.strip("-") for o in options) or "default"
    out = Path(tmp_path) / f"{fixture.stem}.{tag}.py"
    proc = subprocess.run(
        [sys.executable, "-m", "autoaccel", "convert", str(fixture), "-o", str(out), *options],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    _check(proc, f"autoaccel convert {fixture.name} {' '.join(options)}")
    return out
