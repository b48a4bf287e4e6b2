"""Where `convert --to ddp|fsdp` wraps (or shards) a model, and which models it wraps:
fixtures/ddp/placeholder_model.py (`self.model = None` in `__init__`, the model built in
`build_model()`), fixtures/ddp/frozen_encoder.py (a frozen encoder whose optimizer is
built only when fine-tuning) against their snapshots (tests/snapshots/wrap_placement/,
regenerated with AUTOACCEL_UPDATE_SNAPSHOTS=1); and the call sites the facts message
quotes from another module (fixtures/facts/agent_module/). Their runs on two processes
are in tests/test_convert_wrap_placement_runs.py."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from test_facts import DDP, FACTS_FIXTURES, FSDP, snapshot, wrong

from autoaccel.convert.pipeline import convert_source
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.facts.resolve import ConversionFacts
from autoaccel.fileio import read_source

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ddp"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "wrap_placement"
UPDATE = os.environ.get("AUTOACCEL_UPDATE_SNAPSHOTS") == "1"


def converted(name: str, options) -> str:
    conversion = convert_source((FIXTURES / name).read_text(), options, name)
    assert wrong(conversion) == []
    return conversion.converted


@pytest.mark.parametrize("options", [DDP, FSDP], ids=["ddp", "fsdp"])
@pytest.mark.parametrize("name", ["placeholder_model.py", "frozen_encoder.py"])
def test_fixture_matches_snapshot(name, options):
    code = converted(name, options)
    snapshot_file = SNAPSHOTS / f"{name.removesuffix('.py')}.{options.target}.py"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        snapshot_file.write_text(code)
    assert code == snapshot_file.read_text()


@pytest.mark.parametrize(
    "options, placed",
    [
        (DDP, "        self.model.to(self.device)\n        # trained through DDP"),
        (FSDP, "        self.model.to(self.device)\n        # sharded with FSDP2"),
    ],
    ids=["ddp", "fsdp"],
)
def test_the_model_is_wrapped_where_it_is_built_not_at_its_placeholder(options, placed):
    code = converted("placeholder_model.py", options)
    assert placed in code
    assert "        self.model = None\n        self.optimizer = None\n" in code


def test_a_frozen_encoder_is_wrapped_only_with_trainable_parameters():
    # its optimizer is built only when fine-tuning: DDP raises for a module with no
    # parameter that requires a gradient
    code = converted("frozen_encoder.py", DDP)
    assert "    if DISTRIBUTED and any(p.requires_grad for p in encoder.parameters()):\n" in code
    assert "    ddp_decoder = decoder\n    if DISTRIBUTED:\n" in code


def test_an_optimizer_picked_by_an_if_else_needs_no_guard():
    source = textwrap.dedent("""\
        import sys
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
        encoder = nn.Linear(4, 8)
        decoder = nn.Linear(8, 1)
        if "--adam" in sys.argv:
            encoder_optimizer = torch.optim.Adam(encoder.parameters())
        else:
            encoder_optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
        decoder_optimizer = torch.optim.SGD(decoder.parameters(), lr=0.1)
        for x, y in loader:
            loss = nn.functional.mse_loss(decoder(encoder(x)), y)
            loss.backward()
            encoder_optimizer.step()
            decoder_optimizer.step()
        """)
    code = convert_source(source, DDP, "train.py").converted
    assert "ddp_encoder = encoder\nif DISTRIBUTED:\n" in code
    assert "requires_grad" not in code


def test_the_facts_message_quotes_a_call_from_its_own_file():
    """The run shows the agent's model trained in a method of `agent.py`: the refusal
    quotes that call from `agent.py`, not the text at its position in `train.py`."""
    script = FACTS_FIXTURES / "agent_module" / "train.py"
    project = find_project(script, read_source(script))
    assert project is not None
    facts = snapshot("agent_module/train")[0]
    given = ConversionFacts(facts, script, project.script.source.text)
    conversion = convert_project(project, DDP, str(script), given).files[0].conversion
    (message,) = [r for r in wrong(conversion) if r.startswith("the run shows")]
    assert "called as `self.policy(states)` at " in message
    assert "agent_module/agent.py:14:27" in message
