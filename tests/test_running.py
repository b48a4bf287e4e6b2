"""`SessionRuns`: what several test modules run or convert is done once per session, and
the run tests' jobs run on background threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

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


def _waiting(release: threading.Event, calls: list):
    def job(shared: SessionRuns, name: str) -> str:
        calls.append(name)
        assert release.wait(10), "never released"
        return f"{name} done"

    return job


def test_a_job_runs_in_the_background_once_for_its_arguments(tmp_path):
    release, calls = threading.Event(), []
    job = _waiting(release, calls)
    shared = SessionRuns(tmp_path)
    first = shared.start(job, "a")
    assert not first.done()  # `start` did not wait for it
    assert shared.start(job, "a") is first
    other = shared.start(job, "b")
    release.set()
    assert (first.result(10), other.result(10)) == ("a done", "b done")
    assert sorted(calls) == ["a", "b"]
    shared.close()


def test_close_drops_the_jobs_not_yet_started_and_waits_for_the_others(tmp_path):
    release, calls = threading.Event(), []
    job = _waiting(release, calls)
    shared = SessionRuns(tmp_path)
    running = [shared.start(job, name) for name in ("a", "b")]  # both threads busy
    queued = shared.start(job, "c")
    closing = threading.Thread(target=shared.close)
    closing.start()
    for _ in range(100):
        if queued.cancelled():
            break
        time.sleep(0.01)
    assert queued.cancelled()
    release.set()
    closing.join(10)
    assert [f.result(0) for f in running] == ["a done", "b done"] and sorted(calls) == ["a", "b"]


def test_folders_for_jobs_are_new_each_time(tmp_path):
    shared = SessionRuns(tmp_path)
    first, second = shared.folder("ddp-gan"), shared.folder("ddp-gan")
    assert first != second and first.parent == second.parent == tmp_path
    assert first.name.startswith("ddp-gan-") and not any(first.iterdir())
    shared.close()


@pytest.mark.parametrize(
    "params, default, expected",
    [
        ([{"name": "b.py"}, {"name": "a.py"}, {"name": "b.py", "launcher": "spawn"}], None, ["a.py", "b.py"]),
        ([{"launcher": "spawn"}, None, {"name": "b.py"}], "a.py", ["a.py", "b.py"]),
        ([{"launcher": "spawn"}, None], None, []),
    ],
    ids=["distinct-sorted", "default-for-the-others", "none-left-out"],
)
def test_selected_names_of_parametrized_tests(params, default, expected):
    tests = [SimpleNamespace() if p is None else SimpleNamespace(callspec=SimpleNamespace(params=p)) for p in params]
    assert running.selected(tests, "name", default) == expected
