"""`SessionRuns`: what several test modules run or convert is done once per session, and
the run tests' jobs run on background threads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
        (
            [{"name": "b.py"}, {"name": "a.py"}, {"name": "b.py", "launcher": "spawn"}],
            None,
            ["a.py", "b.py"],
        ),
        ([{"launcher": "spawn"}, None, {"name": "b.py"}], "a.py", ["a.py", "b.py"]),
        ([{"launcher": "spawn"}, None], None, []),
    ],
    ids=["distinct-sorted", "default-for-the-others", "none-left-out"],
)
def test_selected_names_of_parametrized_tests(params, default, expected):
    tests = [
        SimpleNamespace() if p is None else SimpleNamespace(callspec=SimpleNamespace(params=p))
        for p in params
    ]
    assert running.selected(tests, "name", default) == expected


ENV_PROBE = (
    "import json, os\njson.dump(dict(os.environ), open(f\"env-{os.environ['RANK']}.json\", 'w'))\n"
)


@pytest.mark.runs
def test_forked_ranks_get_the_environment_torchrun_gives_its_workers(tmp_path):
    """`run_ranks` forks the ranks in torchrun's stead: each gets what a real torchrun's
    worker gets, but for the port, the run id, the agent's store and its error file."""
    pytest.importorskip("torch")
    own = {
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "TORCHELASTIC_ERROR_FILE",
    }
    envs = {}
    for launcher, run in [("real", _real_torchrun), ("forked", running.run_ranks)]:
        folder = tmp_path / launcher
        folder.mkdir()
        (folder / "probe.py").write_text(ENV_PROBE)
        assert run(folder / "probe.py", (), folder).returncode == 0
        envs[launcher] = [json.loads((folder / f"env-{rank}.json").read_text()) for rank in (0, 1)]
    for real, forked in zip(envs["real"], envs["forked"]):
        assert {k: v for k, v in real.items() if k not in own} == {
            k: v for k, v in forked.items() if k not in own
        }
        assert forked["TORCHELASTIC_USE_AGENT_STORE"] == "False" and int(forked["MASTER_PORT"])


def _real_torchrun(script, args, cwd):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
    ]
    return subprocess.run(
        command, cwd=cwd, env=running._env(), capture_output=True, timeout=running.TIMEOUT_S
    )


@pytest.mark.runs
def test_when_one_rank_fails_the_other_is_stopped(tmp_path):
    """As torchrun does: rank 1 waiting for ever is killed when rank 0 fails."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '0':\n    sys.exit('rank 0 failed')\ntime.sleep(600)\n"
    )
    started = time.monotonic()
    run = running.run_ranks(script, (), tmp_path)
    assert run.returncode == 1 and "rank 0 failed" in run.stderr
    assert time.monotonic() - started < 60


# -- the runs the product starts: AUTOACCEL_PYTHON, the fork server's socket --------------
PROBE = """\
import json, os, sys
print("out", sys.argv[1:])
print("err", file=sys.stderr)
streams = [type(sys.stdout.buffer).__name__, sys.stdout.line_buffering, sys.stdout.write_through,
           sys.stderr.line_buffering, sys.stderr.write_through]
json.dump({"env": dict(os.environ), "path": sys.path, "argv": sys.argv, "streams": streams,
           "executable": sys.executable, "parent": os.getppid()}, open("probe.json", "w"))
sys.exit(int(sys.argv[1]))
"""
SLEEPER = "import os, pathlib, time\npathlib.Path(f'pid-{os.getpid()}').touch()\ntime.sleep(120)\n"


def _product_runs() -> str:
    """The shim (AUTOACCEL_PYTHON) of this session's fork server."""
    pytest.importorskip("torch")
    if running._product_runs is None or running._fork_server() is None:
        pytest.skip("AUTOACCEL_TESTS_FORK_SERVER=0, or no fork here")
    return running.SESSION_ENV["AUTOACCEL_PYTHON"]


@pytest.mark.runs
def test_a_run_through_the_shim_is_a_run_of_the_interpreter(tmp_path):
    """`-u -m autoaccel.run.harness` with a PYTHONPATH entry, forked by the server: the same exit
    code, output bytes, environment, `sys.path`, `sys.argv` and streams as the interpreter's."""
    shim = _product_runs()
    (tmp_path / "lib").mkdir()
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**running._env(), "PYTHONPATH": "lib"}
    seen = {}
    for python in (sys.executable, shim):
        command = [
            python,
            "-u",
            "-m",
            "autoaccel.run.harness",
            "--losses-out",
            "record.json",
            "probe.py",
            "3",
        ]
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=60)
        probe = json.loads((tmp_path / "probe.json").read_text())
        seen[python] = proc.returncode, proc.stdout, proc.stderr, probe
    assert seen[shim][3].pop("parent") == running._fork_server()._proc.pid  # forked
    seen[sys.executable][3].pop("parent")
    assert seen[shim] == seen[sys.executable]
    assert str(tmp_path / "lib") in seen[shim][3]["path"]


@pytest.mark.runs
def test_the_shim_runs_what_the_server_refuses_with_the_interpreter(tmp_path):
    shim = _product_runs()
    code = "import os, sys; print(sys.executable, os.getpid()); sys.exit(4)"
    proc = subprocess.Popen(
        [shim, "-c", code], env=running._env(), stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 4 and out.split() == [sys.executable, str(proc.pid)]  # exec'd


def _started(folder, client: subprocess.Popen) -> int:
    """The pid of the run of SLEEPER that `client` started (once it wrote its file)."""
    deadline = time.monotonic() + 30
    while not list(folder.glob("pid-*")):
        assert client.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    return int(next(folder.glob("pid-*")).name.removeprefix("pid-"))


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (waiting a moment for the server to reap it)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.runs
def test_sigterm_to_the_shim_reaches_the_run_and_the_shim_ends_as_it(tmp_path):
    shim = _product_runs()
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    command = [shim, "-m", "autoaccel.run.harness", "--losses-out", "record.json", "sleeper.py"]
    client = subprocess.Popen(command, cwd=tmp_path, env=running._env())
    pid = _started(tmp_path, client)
    assert pid != client.pid  # forked
    client.send_signal(signal.SIGTERM)
    assert client.wait(10) == -signal.SIGTERM and _gone(pid)


@pytest.mark.runs
def test_a_killed_shim_leaves_no_run(tmp_path):
    """The product's timeout SIGKILLs the shim's process group: the server kills the run's."""
    shim = _product_runs()
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    command = [shim, "-m", "autoaccel.run.harness", "--losses-out", "record.json", "sleeper.py"]
    client = subprocess.Popen(command, cwd=tmp_path, env=running._env(), start_new_session=True)
    pid = _started(tmp_path, client)
    os.killpg(client.pid, signal.SIGKILL)
    client.wait(10)
    assert _gone(pid)


@pytest.mark.runs
@pytest.mark.parametrize("through_the_shim", [True, False], ids=["forked", "fresh"])
def test_a_timed_out_torchrun_job_leaves_no_process(through_the_shim, tmp_path, monkeypatch):
    """Forked, the agent and its workers (the workers through the shim, in sessions of
    their own): the product's timeout stops the agent's group, the server the workers'.
    Fresh: the agent, sent SIGTERM first, stops its workers."""
    from autoaccel.run import runner

    if through_the_shim:
        monkeypatch.setenv("AUTOACCEL_PYTHON", _product_runs())
    else:
        monkeypatch.delenv("AUTOACCEL_PYTHON", raising=False)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    monkeypatch.chdir(tmp_path)
    run = runner.run_script(tmp_path / "sleeper.py", [], 1, tmp_path / "records", nproc=2, timeout=6,
                            env={"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert run.failed and "stopped after 6 s" in run.record["exit"]
    pids = [int(path.name.removeprefix("pid-")) for path in tmp_path.glob("pid-*")]
    assert len(pids) == 2 and all(map(_gone, pids))
