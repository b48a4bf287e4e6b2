"""The static gates of `.ci/run`: black, ruff and mypy run before the tests, and the mypy
gate fails on errors above its baseline, passes (with a hint) below it. The gate's logic
is checked on made-up mypy output; mypy itself does not run here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mypy_gate", ROOT / ".ci" / "mypy_gate.py")
assert _spec is not None and _spec.loader is not None
gate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate)

OUTPUT = """\
autoaccel/a.py:3: error: Argument 1 to "f" has incompatible type "int"; expected "str"  [arg-type]
autoaccel/a.py:9:5: error: Argument 2 to "f" has incompatible type "int"; expected "str"  [arg-type]
autoaccel/a.py:12: note: By default the bodies of untyped functions are not checked  [annotation-unchecked]
autoaccel/b.py:7: error: "Node" has no attribute "value"  [attr-defined]
Found 3 errors in 2 files (checked 2 source files)
"""


@pytest.fixture
def baseline(tmp_path, monkeypatch):
    monkeypatch.setattr(gate, "ROOT", tmp_path)
    path = tmp_path / "mypy-baseline.json"
    path.write_text(
        json.dumps({"autoaccel/a.py": {"arg-type": 2}, "autoaccel/b.py": {"attr-defined": 1}})
    )
    return path


def test_counts_errors_by_file_and_code_not_notes():
    counts, _ = gate.parse(OUTPUT)
    assert counts == {("autoaccel/a.py", "arg-type"): 2, ("autoaccel/b.py", "attr-defined"): 1}


def test_passes_at_the_baseline(baseline, capsys):
    assert gate.check(OUTPUT, baseline) == 0
    assert "3 errors, as in the baseline" in capsys.readouterr().out


def test_fails_when_a_count_grows(baseline, capsys):
    more = OUTPUT + 'autoaccel/b.py:20: error: "Node" has no attribute "test"  [attr-defined]\n'
    assert gate.check(more, baseline) == 1
    out = capsys.readouterr().out
    assert "autoaccel/b.py [attr-defined]: 2, baseline 1" in out
    assert 'has no attribute "test"' in out and "FAILED" in out


def test_fails_on_a_new_file_and_code(baseline, capsys):
    new = OUTPUT.replace("autoaccel/b.py:7:", "autoaccel/c.py:7:")
    assert gate.check(new, baseline) == 1
    assert "autoaccel/c.py [attr-defined]: 1, baseline 0" in capsys.readouterr().out


def test_passes_and_hints_when_counts_shrink(baseline, capsys):
    fewer = "\n".join(line for line in OUTPUT.splitlines() if "b.py" not in line)
    assert gate.check(fewer, baseline) == 0
    out = capsys.readouterr().out
    assert "fewer than the baseline's 3" in out and "--update" in out
    assert json.loads(baseline.read_text())["autoaccel/b.py"] == {"attr-defined": 1}  # untouched


def test_update_rewrites_the_baseline(baseline):
    fewer = "\n".join(line for line in OUTPUT.splitlines() if "b.py" not in line)
    assert gate.check(fewer, baseline, update=True) == 0
    assert json.loads(baseline.read_text()) == {"autoaccel/a.py": {"arg-type": 2}}
    assert gate.check(fewer, baseline) == 0


def test_ci_runs_the_gates_before_the_tests():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    tests = first('exec bash -c "$test_command"')
    gates = [first("gate black"), first("gate ruff"), first("gate mypy")]
    assert "--check ." in lines[gates[0]] and "ruff check ." in lines[gates[1]]
    assert ".ci/mypy_gate.py" in lines[gates[2]]
    failed = first("static gates failed")
    assert max(gates) < failed < tests and lines[failed + 1].strip() == "exit 1"
