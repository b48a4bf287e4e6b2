"""`convert --to ddp|fsdp` of reinforcement-learning shapes: a round that collects new
rollouts and then trains on all of them (each process collects its own: converted), a DQN
whose target network copies the trained one (`--to fsdp`: the copy is whole on every
process), and a policy trained through a method other than `forward()`, which only a run
shows. What the ranks draw is checked in
tests/test_convert_tensor_data_runs.py; that the proof fails processes which collect the
same rollouts, here (marked `runs`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_facts import snapshot

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.verify import VerifyRequest, verify_ddp, write_one
from autoaccel.facts.resolve import ConversionFacts

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")


def convert_fixture(name: str, options: ConvertOptions = DDP):
    path = FIXTURES / name
    return convert_source(path.read_text(encoding="utf-8"), options, str(path))


def wrong(log) -> list:
    return [s for s in log.skipped if s.wrong]


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_rounds_of_new_rollouts_are_not_full_batch_training(options):
    """Each round draws new states (`torch.randn`) and trains 3 steps on all of them: it
    was refused as full-batch training; each process collects its own rollouts."""
    conversion = convert_fixture("ddp/rollout_rounds.py", options)
    assert not wrong(conversion.log)
    (note,) = [s for s in conversion.log.skipped if s.what == "DistributedSampler"]
    assert (
        note.line == 26 and "each process draws its own from its own random stream" in note.reason
    )
    assert "torch.manual_seed(torch.initial_seed() + RANK)" in conversion.converted


def test_rounds_whose_draws_are_not_seen_are_refused_saying_what_decides():
    """States from an environment the analysis cannot read: whether each process collects
    its own rollouts depends on how it is seeded. Before, "full-batch training"."""
    source = (
        (FIXTURES / "ddp/rollout_rounds.py")
        .read_text()
        .replace("import torch\n", "import torch\nimport sensors\n", 1)
        .replace("    states = torch.randn(32, 4)\n", "    states = sensors.read(32)\n")
    )
    conversion = convert_source(source, DDP, "train.py")
    (skip,) = wrong(conversion.log)
    assert skip.line == 27  # `for _ in range(3):` of `Agent.update()`
    assert skip.reason.startswith(
        "this training loop trains on all of its data at every step, and `agent.update(states,"
        " actions, rewards)` runs it inside a loop that does more each round, such as"
        " collecting rollouts: if each process collects its own"
    )


@pytest.mark.runs
def test_the_proof_fails_processes_that_collect_the_same_rollouts(tmp_path):
    """What the proof checks of processes that read no DataLoader: they must not compute
    the same losses. Each round seeded alike after the per-rank seed (as an environment
    seeded with a constant would be, which the conversion cannot see), both processes
    collect the same rollouts: that check fails, and only that one."""
    seeded = "for round in range(6):\n    torch.manual_seed(round)\n"
    script = tmp_path / "rollout_rounds.py"
    script.write_text(
        (FIXTURES / "ddp/rollout_rounds.py").read_text().replace("for round in range(6):\n", seeded)
    )
    converted = convert_fixture("ddp/rollout_rounds.py").converted
    assert converted.count("for round in range(6):\n") == 1
    converted = converted.replace("for round in range(6):\n", seeded)
    found, _ = verify_ddp(
        script, write_one(script, converted), VerifyRequest([], steps=6), [tmp_path]
    )
    failed = {check.name: check.detail for check in found if not check.passed}
    assert failed == {
        "processes train on different data": "every process computed the same losses: they train on the same data"
    }


def test_a_copy_into_a_target_network_not_sharded_yet_is_whole_on_every_process():
    """`q_target.load_state_dict(q.state_dict())` right after building both, before
    `q_target` is sharded: rank 0 alone got the whole dict, and every other process failed
    to load its empty one. The refresh in the loop (both sharded) keeps rank 0's dict."""
    code = convert_fixture("ddp/replay_buffer.py", FSDP).converted
    assert (
        "    q_state = full_state_dict_everywhere(q)\n"
        "    load_full_state_dict(q_target, q_state)\n"
    ) in code
    assert (
        "            q_state = full_state_dict(q)\n"
        "            load_full_state_dict(q_target, q_state)\n"
    ) in code
    assert "        options = StateDictOptions(full_state_dict=True)\n" in code


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
def test_a_model_trained_through_another_method_trains_through_it(options):
    """The run shows `Policy()` trained but never called: the training step runs it
    through `self.policy.evaluate()`. Before, refused at that call; now the call goes to
    a DDP wrapper that runs `evaluate()` as its forward(), or `evaluate()` is registered as
    a forward method of the sharded policy (tests/test_convert_method_forward.py)."""
    facts, path, source = snapshot("agent_method")
    conversion = convert_source(source, options, str(path), ConversionFacts(facts, path, source))
    assert not wrong(conversion.log)
    routed = (
        "log_probs, values = self.ddp_policy_evaluate(states, actions)"
        if options is DDP
        else 'register_fsdp_forward_method(self.policy, "evaluate")'
    )
    assert routed in conversion.converted
