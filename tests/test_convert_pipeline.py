"""The pipeline's process-wide settings: what a conversion changes, it puts back."""

from __future__ import annotations

import gc
import threading

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source, fewer_collections


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
