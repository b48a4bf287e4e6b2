"""The pipeline: its process-wide settings (what a conversion changes, it puts back)
and what its steps share."""

from __future__ import annotations

import gc
import threading

from pathlib import Path

from autoaccel.convert import transform
from autoaccel.convert.log import ConversionLog, ConvertOptions
from autoaccel.convert.pipeline import ModuleState, apply_step, convert_source, fewer_collections
from autoaccel.convert.transforms.add_autocast import AddAutocast
from autoaccel.convert.transforms.rule_fixes import SingleProcessFixes

ROOT = Path(__file__).resolve().parent.parent


def test_collector_thresholds_come_back_after_a_conversion() -> None:
    before = gc.get_threshold()
    convert_source("import torch\nx = torch.zeros(2).cuda()\n", ConvertOptions())
    assert gc.get_threshold() == before


def test_overlapping_conversions_restore_the_thresholds_once_all_end() -> None:
    before = gc.get_threshold()
    first_in, second_done = threading.Event(), threading.Event()

    def first() -> None:
        with fewer_collections():
            first_in.set()
            second_done.wait(5)  # the second conversion starts and ends meanwhile

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with fewer_collections():
        pass
    raised = gc.get_threshold()
    second_done.set()
    thread.join()
    assert raised[0] > before[0]  # the first one still runs: still raised
    assert gc.get_threshold() == before


def test_the_step_after_the_rule_fixes_reuses_the_script_model_they_built(monkeypatch) -> None:
    # The rule fixes lint the module they hand on: the next step needs no analysis.
    source = (ROOT / "fixtures" / "resnet_cifar.py").read_text()
    options, log = ConvertOptions(target="ddp"), ConversionLog()
    state = ModuleState.of(source)
    apply_step(SingleProcessFixes, state, state.context(options, log, None))
    assert state.text != source
    script = state.analyses[id(state.tree)].script
    assert script is not None and script.index is not None and script.index.module is state.tree
    built: list[object] = []
    monkeypatch.setattr(transform, "build_script_model", lambda *args, **kwargs: built.append(args))
    step = AddAutocast(state.context(options, log, None))
    step.transform_module(state.tree)
    assert built == [] and step.script is script


STAR_IMPORTED_TORCH = """\
from common import *

loader = DataLoader(dataset, batch_size=8)
model = Net()
optimizer = optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    with torch.cuda.amp.autocast():
        loss = model(x).sum()
    loss.backward()
    optimizer.step()
"""


def test_names_a_step_imports_get_their_rule_fixes_in_the_same_conversion() -> None:
    """`torch` comes from a star import, so the rules cannot tell `torch.cuda.amp.autocast`
    until the set-up's `import torch`: the conversion applies that fix too, or converting
    its output would change it again (refused as not idempotent)."""
    for target in ("ddp", "fsdp"):
        result = convert_source(STAR_IMPORTED_TORCH, ConvertOptions(target=target))
        assert 'with torch.autocast("cuda"):' in result.converted
        assert [c.code for c in result.log.changes].count("ACC302") == 1
        # the first run of the fixes logged what it left; the second logs no copy of it
        skipped = [(s.what, s.line) for s in result.log.skipped]
        assert len(skipped) == len(set(skipped))


def test_a_module_dunder_above_the_imports_gets_the_fixes_in_the_first_pass() -> None:
    """`__author__ = ...` above the imports hid the import block from the cuDNN fix
    until the DDP set-up had put imports above it: converting the output then added
    `cudnn.benchmark` (refused as not idempotent)."""
    source = (
        "__author__ = 'me'\n\nimport torch\nfrom torch import nn\n\n"
        "model = nn.Conv2d(1, 4, 3).cuda()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(range(8), batch_size=2)\n"
        "for x in loader:\n    model(x.cuda()).sum().backward()\n    optimizer.step()\n"
    )
    converted = convert_source(source, ConvertOptions(target="ddp")).converted
    assert converted.startswith("__author__ = 'me'\n\nimport")
    assert converted.count("torch.backends.cudnn.benchmark = True") == 1
