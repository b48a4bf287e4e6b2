"""The sixth unseen set's ViT (a src-layout package): fixtures/facts/src_layout/, whose entry
point src/tinyvit/cli/main.py imports `tinyvit.training.loop` by the package's name, and
whose loop decides after the backward pass whether the optimizer steps (`do_step = ...`,
then `if do_step:`). The project's `src/` is where imports are looked up (the loop was not
found: "no training loop"); the accumulation's decision moves above the forward, where
`no_sync()` needs it (it read `do_step` before it was assigned).
tests/test_convert_src_layout_runs.py proves the result and the copy `-o` writes."""

from __future__ import annotations

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.project_conversion import convert_project, find_project
from autoaccel.fileio import read_source
from running import FIXTURES_DIR

SCRIPT = FIXTURES_DIR / "facts" / "src_layout" / "src" / "tinyvit" / "cli" / "main.py"


def converted_loop() -> str:
    project = find_project(SCRIPT, read_source(SCRIPT))
    assert project is not None
    result = convert_project(project, ConvertOptions(target="ddp", amp="off"), str(SCRIPT))
    (loop,) = [f.conversion.converted for f in result.files if f.file.path.name == "loop.py"]
    return loop


def test_the_package_s_loop_is_converted_and_the_step_decided_before_the_forward():
    assert (
        "        for step, (inputs, targets) in enumerate(loader, start=1):\n"
        "            do_step = step % accumulation == 0 or step == len(loader)\n"
        "            # all-reduce the gradients only on the micro-step that updates the weights\n"
        "            sync_gradients = do_step\n"
    ) in converted_loop()
