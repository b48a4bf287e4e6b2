"""Smoke tests for the training-script fixtures in fixtures/.

Every fixture is run unmodified, on CPU, in a temporary working directory, under
`autoaccel.run.harness` (which only records the losses): the very run the conversion tests
compare with, done once per session. All of them must train and exit 0, except
legacy_pytorch03.py, which is written for PyTorch 0.3 and must crash on current PyTorch
(``loss.data[0]`` on a 0-dim tensor) - converting it is what fixes it.
"""

import ast
from concurrent.futures import Future

import pytest

pytest.importorskip("torch")

from running import FIXTURES_DIR, SessionRuns, fixture_names, runs_fixture, selected

# name -> (extra argv, files the run must leave in its working directory)
FIXTURES = {
    "cnn_toplevel.py": ([], ["cnn_model.pth"]),
    "mnist_main.py": (["--save-model"], ["mnist_cnn.pt"]),
    "lstm_lm.py": ([], ["model.pt"]),
    "legacy_pytorch03.py": ([], []),
    "trainer_class.py": ([], ["checkpoints/last.pt", "checkpoints/best.pt"]),
    "gan.py": ([], ["netG_epoch_1.pth", "netD_epoch_1.pth"]),
    "transformer_accum.py": ([], ["transformer.pt"]),
    "dataparallel_existing.py": ([], ["signal_best.pth"]),
    "linear_exact.py": (["--save-params", "params.pt"], ["params.pt"]),
    "resnet_cifar.py": ([], ["resnet_cifar.pt"]),
    "transformer_lm.py": ([], ["transformer_lm.pt"]),
    "trainer_methods.py": ([], ["trainer_methods.pt"]),
    "step_functions.py": ([], ["step_functions.pt"]),
    "imbalanced_resume.py": ([], ["imbalanced.pt"]),
}

EXPECTED_FAILURES = {
    "legacy_pytorch03.py": "IndexError: invalid index of a 0-dim tensor",
}


def _run(shared: SessionRuns, name: str):
    return shared.run(FIXTURES_DIR / name, FIXTURES[name][0])


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """Each selected fixture's run, in the background (see running.py)."""
    return {name: shared.start(_run, name) for name in selected(tests)}


fixture_runs = runs_fixture(start_runs)


def test_fixture_list_is_complete():
    on_disk = set(fixture_names())
    assert on_disk == set(FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_docstring_and_size(name):
    source = (FIXTURES_DIR / name).read_text()
    doc = ast.get_docstring(ast.parse(source))
    assert doc, f"{name} has no module docstring"
    assert "Slow patterns on purpose:" in doc
    assert 60 <= len(source.splitlines()) <= 200


@pytest.mark.runs
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_runs(name, fixture_runs):
    _, outputs = FIXTURES[name]
    run = fixture_runs[name].result()
    if name in EXPECTED_FAILURES:
        assert run.returncode != 0, f"{name} unexpectedly succeeded"
        assert EXPECTED_FAILURES[name] in run.stderr, run.stderr[-3000:]
        return
    run.check()
    for rel in outputs:
        assert (run.cwd / rel).is_file(), f"{name} did not write {rel}"
