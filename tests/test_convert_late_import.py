"""fixtures/ddp/late_import.py imports `os` after some code (S12 of bench31: awd_lstm).
The process-group block goes after the imports at the top and reads `os.environ`, so the
conversion adds `import os` to those imports: the script's own `import os` further down
binds the name too late, and the converted file raised NameError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.cst_edit import add_import

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ddp" / "late_import.py"
TARGETS = ["ddp", "fsdp"]


def test_a_line_below_the_code_that_needs_it_does_not_count():
    module = cst.parse_module("import torch\nx = os.sep\nimport os\n")
    needed_by = module.body[1]
    assert add_import(module, "import os").code == module.code
    assert add_import(module, "import os", needed_by=needed_by).code == (
        "import os\n\nimport torch\nx = os.sep\nimport os\n"
    )
    above = cst.parse_module("import os\nimport torch\nx = os.sep\n")
    assert add_import(above, "import os", needed_by=above.body[2]).code == above.code


def _converted(target: str) -> str:
    options = ConvertOptions(target=target, amp="off")
    conversion = convert_source(FIXTURE.read_text(), options, str(FIXTURE))
    assert not [s for s in conversion.log.skipped if s.wrong]
    return conversion.converted


@pytest.mark.parametrize("target", TARGETS)
def test_the_set_up_block_reads_an_imported_os(target):
    converted = _converted(target)
    top, _ = converted.split('DISTRIBUTED = "LOCAL_RANK" in os.environ\n')
    assert "\nimport os\n" in top
    assert converted.count("\nimport os\n") == 2  # the script's own line stays where it is


@pytest.mark.runs
@pytest.mark.parametrize("target", TARGETS)
def test_the_converted_script_runs_with_plain_python(target, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_converted(target))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "epoch 2: loss" in done.stdout
