"""Proof by running: a model trained through a method other than `forward()`
(fixtures/ddp/method_trained_agent.py, `self.net.evaluate(obs, actions)`), converted
with `--to ddp` (the method runs as the forward() of a DDP wrapper) and `--to fsdp` (the
method registered as a forward method of the sharded model), trains under
`torchrun --nproc_per_node=2` (gloo, CPU): both ranks end with the same parameters
(FSDP's gathered whole), which their updates changed. Without the conversion's routing
each rank would train its own copy on its own rollouts, and the parameters would differ.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from running import DDP_OPTIONS, SessionRuns, runs_fixture
from test_convert_ddp_runs import run_torchrun

pytest.importorskip("torch")
pytestmark = pytest.mark.runs

FIXTURE = "ddp/method_trained_agent.py"
OPTIONS = {"ddp": DDP_OPTIONS, "fsdp": ("--to", "fsdp", "--amp", "off")}
PARAMETER_TOLERANCE = 1e-6  # relative: both ranks apply the same averaged gradients


def _job(shared: SessionRuns, target: str) -> list[dict]:
    converted = shared.convert(FIXTURE, *OPTIONS[target])
    return run_torchrun(converted, (), shared.folder(f"method-forward-{target}"))


def start_runs(shared: SessionRuns, tests: list) -> dict[str, Future]:
    """Each target's conversion run on two ranks, in the background (see running.py)."""
    return {target: shared.start(_job, target) for target in OPTIONS}


ranks = runs_fixture(start_runs)


@pytest.mark.parametrize("target", sorted(OPTIONS))
def test_both_ranks_end_with_the_same_trained_parameters(target, ranks):
    first, second = ranks[target].result()
    assert first["param_digest"], "no optimizer's parameters recorded"
    assert second["param_digest"] == [
        pytest.approx(d, rel=PARAMETER_TOLERANCE) for d in first["param_digest"]
    ]
    assert (
        first["param_digest"] != first["first_param_digest"]
    ), "the optimizer did not update the model"
    assert len(first["losses"]) == len(second["losses"]) == 12  # 4 rounds of 3 steps
    assert first["losses"] != second["losses"]  # each rank trains on its own rollouts
