"""`convert --to ddp|fsdp` of training steps that run under a condition each process
computes from its own data (a DQN learns once its replay buffer holds enough): the
processes agree on it through `every_process()`, where they all reach it as often (an `if`
in loops over `range()`); otherwise refused at the condition, saying why. What the ranks
do is checked in tests/test_convert_episode_guard_runs.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "episode_guard.py"
DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")
REFUSED = (
    "the training steps, which draw their batches at random, run only while `memory.size() > 40`"
    " holds, which each process computes from its own data"
)


def convert(source: str, options: ConvertOptions = DDP):
    return convert_source(source, options, str(FIXTURE))


def wrong(log) -> list:
    return [s for s in log.skipped if s.wrong]


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_a_buffer_size_checked_once_an_episode_is_agreed_by_every_process(options):
    """Before, refused: "run only while `memory.size() > 40` holds ... make the condition
    one every process computes alike"."""
    conversion = convert(FIXTURE.read_text(), options)
    assert not wrong(conversion.log)
    assert "    if every_process(memory.size() > 40):\n" in conversion.converted
    assert "    dist.all_reduce(flag, op=dist.ReduceOp.MIN)\n" in conversion.converted
    (change,) = [c for c in conversion.log.changes if "every_process()" in c.description]
    assert change.line == 65


def test_a_second_conversion_agrees_once():
    first = convert(FIXTURE.read_text()).converted
    assert convert(first).converted == first


@pytest.mark.parametrize("distributed", [False, True])
def test_every_process_is_the_condition_itself_in_one_process(distributed):
    """Under plain `python` nothing is all-reduced: the condition comes back as it was."""
    reduced = []
    dist = SimpleNamespace(
        ReduceOp=SimpleNamespace(MIN="min"), all_reduce=lambda flag, op: reduced.append(op)
    )
    namespace = {"DISTRIBUTED": distributed, "torch": pytest.importorskip("torch"), "dist": dist}
    code = convert(FIXTURE.read_text()).converted
    exec(code[code.index("def every_process(") :].split("\n\n\n")[0], namespace)
    condition = object()
    if distributed:
        assert namespace["every_process"](condition) is True and reduced == ["min"]
    else:
        assert namespace["every_process"](condition) is condition and not reduced


@pytest.mark.parametrize(
    "before, after",
    [
        # at every step of an episode, whose length is each process's own
        (
            "    while not done:\n",
            "    while not done:\n        if memory.size() > 40:\n            learn(q, q_target, memory, optimizer)\n",
        ),
        ("for episode in range(12):\n", "while memory.size() < 90:\n"),
        (
            "        state = next_state\n",
            "        state = next_state\n    if reward < 0:\n        continue\n",
        ),
    ],
    ids=["in-the-episode", "while-loop", "continue"],
)
def test_a_condition_the_processes_do_not_all_reach_as_often_is_refused(before, after):
    source = FIXTURE.read_text().replace(before, after, 1)
    assert source != FIXTURE.read_text()
    skip, *_ = wrong(convert(source).log)
    assert skip.reason.startswith(REFUSED) and "they do not all reach it as often" in skip.reason


def test_a_condition_in_a_function_called_once_an_episode_is_agreed():
    """The check in a function of its own, called from the episode loop: every process
    calls it as often."""
    source = FIXTURE.read_text()
    block = source[source.index("    if memory.size() > 40:\n") :]  # the script's last lines
    source = source.replace(block, "    after_episode(episode)\n").replace(
        "torch.manual_seed(0)\n", f"def after_episode(episode):\n{block}\n\ntorch.manual_seed(0)\n"
    )
    conversion = convert(source)
    assert not wrong(conversion.log)
    assert "    if every_process(memory.size() > 40):\n" in conversion.converted
    refused = convert(
        source.replace("for episode in range(12):\n", "while memory.size() < 90:\n", 1)
    )
    assert REFUSED in wrong(refused.log)[0].reason
