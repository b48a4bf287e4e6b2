"""The results of `convert --to ddp|fsdp` with facts of the fixtures of
tests/test_facts_base_class.py, run under torchrun on two processes: both ranks hold
the original's final parameters (the check of tests/test_facts_convert_runs.py)."""

from __future__ import annotations

import shutil

import pytest
from test_facts import FACTS_FIXTURES
from test_facts_convert_runs import (
    test_converted_with_facts_trains_the_same_on_two_ranks as trains_the_same,
)

pytestmark = pytest.mark.runs


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
@pytest.mark.parametrize("name", ["base_class/main", "model_by_import/run"])
def test_converted_with_facts_trains_the_same_on_two_ranks(tmp_path, name, target):
    models = FACTS_FIXTURES / name.split("/")[0] / "models"
    if models.is_dir():
        # `-o DIR` copies the modules the project imports by name in its code; the one
        # `import_module("models." + name)` finds is not among them (copied here)
        shutil.copytree(models, tmp_path / target / "models")
    trains_the_same(tmp_path, name, target)
