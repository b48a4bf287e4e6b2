"""Buffers preallocated at the batch size (CycleGAN's `input_A = Tensor(opt.batchSize, ...)`,
`Tensor(opt.batchSize).fill_(1.0)`) and read by the training step follow the per-process
batch under `--to ddp`/`--to fsdp`: each process loads `batch_size // WORLD_SIZE` rows, and
a buffer of the global batch fails the copy or broadcasts one row into all of it."""

from __future__ import annotations

import pytest
from running import FIXTURES_DIR

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

NAME = "ddp/preallocated_batch.py"
SOURCE = (FIXTURES_DIR / NAME).read_text(encoding="utf-8")
BUFFERS = "input_x = Tensor(opt.batch_size, 4)\ntarget_real = Tensor(opt.batch_size).fill_(1.0)\n"
PER_PROCESS = (
    "input_x = Tensor(per_process_batch_size(opt.batch_size), 4)\n"
    "target_real = Tensor(per_process_batch_size(opt.batch_size)).fill_(1.0)\n"
)


def _convert(source: str, **options) -> tuple[str, list[str]]:
    conversion = convert_source(source, ConvertOptions(amp="off", **options), NAME)
    assert not [s for s in conversion.log.skipped if s.wrong]
    shaped = [c.description for c in conversion.log.changes if "shapes a tensor" in c.description]
    return conversion.converted, shaped


@pytest.mark.parametrize("target", ["ddp", "fsdp"])
def test_buffers_of_a_tensor_type_take_the_per_process_batch(target):
    """`Tensor` is `torch.cuda.FloatTensor` or `torch.Tensor`: both buffers the step reads
    are made at the per-process batch, the option itself left as the script wrote it."""
    code, shaped = _convert(SOURCE, target=target)
    assert PER_PROCESS in code and BUFFERS not in code
    assert (
        shaped
        == [
            "`opt.batch_size` shapes a tensor the training step reads: it takes the per-process"
            " batch, `per_process_batch_size(opt.batch_size)`"
        ]
        * 2
    )


@pytest.mark.parametrize(
    "buffers",
    [
        "input_x = torch.empty(opt.batch_size, 4)\ntarget_real = torch.full((opt.batch_size,), 1.0)\n",
        "input_x = torch.FloatTensor(opt.batch_size, 4)\ntarget_real = torch.Tensor(opt.batch_size).fill_(1.0)\n",
    ],
    ids=["factories", "torch-types"],
)  # fmt: skip
def test_buffers_of_torch_factories_and_types_take_the_per_process_batch(buffers):
    code, shaped = _convert(SOURCE.replace(BUFFERS, buffers), target="ddp")
    assert buffers.replace("opt.batch_size", "per_process_batch_size(opt.batch_size)") in code
    assert len(shaped) == 2


def test_per_process_batch_option_keeps_the_buffers():
    """`--per-process-batch`: each process loads `opt.batch_size` rows, as the buffers hold."""
    code, shaped = _convert(SOURCE, target="ddp", per_process_batch=True)
    assert BUFFERS in code and "per_process_batch_size" not in code and shaped == []


def test_a_buffer_of_another_size_or_unread_by_the_step_is_left():
    """A buffer sized by a variable the loader does not take its batch from, and one the
    training step never reads, keep their sizes."""
    others = (
        "input_x = Tensor(opt.eval_batch_size, 4)\n"
        "target_real = Tensor(opt.batch_size).fill_(1.0)\n"
        "unused = Tensor(opt.batch_size, 4)\n"
    )
    source = SOURCE.replace(BUFFERS, others)
    code, shaped = _convert(source, target="ddp")
    assert "input_x = Tensor(opt.eval_batch_size, 4)\n" in code
    assert "unused = Tensor(opt.batch_size, 4)\n" in code
    assert "target_real = Tensor(per_process_batch_size(opt.batch_size)).fill_(1.0)\n" in code
    assert len(shaped) == 1


def test_a_tensor_type_in_the_step_takes_the_per_process_batch():
    """Made in the step, `Tensor(opt.batch_size)` takes a shape as `torch.ones(...)` does."""
    source = SOURCE.replace("target_real = Tensor(opt.batch_size).fill_(1.0)\n", "").replace(
        "        real_x = input_x.copy_(x)\n",
        "        real_x = input_x.copy_(x)\n        target_real = Tensor(opt.batch_size).fill_(1.0)\n",
    )
    code, shaped = _convert(source, target="ddp")
    assert "    target_real = Tensor(per_process_batch_size(opt.batch_size)).fill_(1.0)\n" in code
    assert len(shaped) == 2 and "shapes a tensor of the training step" in shaped[1]
