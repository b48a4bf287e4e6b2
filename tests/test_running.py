"""`SessionRuns`: what several test modules run or convert is done once per session."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import running
from running import SessionRuns


@pytest.fixture
def conversions(monkeypatch):
    """Stand in for `autoaccel convert`: record each call, take a moment, write the output."""
    calls = []
    lock = threading.Lock()

    def convert(fixture, folder, *options):
        with lock:
            calls.append((fixture.read_text(), options))
        time.sleep(0.05)  # long enough for the other threads to ask meanwhile
        out = folder / "out.py"
        out.write_text(f"# converted with {options}\n")
        return out

    monkeypatch.setattr(running, "convert", convert)
    return calls


def test_a_conversion_asked_for_at_once_by_several_threads_is_made_once(tmp_path, conversions):
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    shared = SessionRuns(tmp_path)
    with ThreadPoolExecutor(max_workers=4) as pool:
        paths = list(pool.map(lambda _: shared.convert(script, "--amp", "off"), range(4)))
    assert len(set(paths)) == 1 and paths[0].read_text() == "# converted with ('--amp', 'off')\n"
    assert conversions == [("import torch\n", ("--amp", "off"))]


def test_other_options_or_other_content_convert_again(tmp_path, conversions):
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    shared = SessionRuns(tmp_path)
    first = shared.convert(script, "--amp", "off")
    assert shared.convert(script, "--amp", "bf16") != first
    script.write_text("import torch  # edited\n")
    assert shared.convert(script, "--amp", "off") != first
    assert len(conversions) == 3


def test_a_failure_reaches_every_caller(tmp_path, monkeypatch):
    calls = []

    def failing(fixture, folder, *options):
        calls.append(options)
        raise AssertionError("autoaccel convert exited with 2")

    monkeypatch.setattr(running, "convert", failing)
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    shared = SessionRuns(tmp_path)
    for _ in range(2):
        with pytest.raises(AssertionError, match="exited with 2"):
            shared.convert(script)
    assert calls == [()]
