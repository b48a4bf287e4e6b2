"""Refusals name the line and a reason a user can act on (issue 29): a crashed proof names
the process that failed of its own accord, its exception and the innermost line of the
user's files (not another process's "Connection reset by peer"); `--to fsdp` refuses a
TensorBoard graph traced from a sharded model on rank 0 alone; the global batch size in
a training step points at `--per-process-batch`."""

from __future__ import annotations

import os
import textwrap

import pytest

from autoaccel.convert.log import ConvertOptions, Skipped
from autoaccel.convert.pipeline import Conversion, convert_source
from autoaccel.convert.verify import checks, crashes, user_place
from autoaccel.run.runner import Run
from test_convert_fsdp import convert

TORCH = "/venv/lib/python3.11/site-packages/torch"
HARNESS_FRAMES = """\
Traceback (most recent call last):
  File "/work/autoaccel/run/harness.py", line 173, in run_as_main
    runpy.run_path(script, run_name="__main__")
  File "<frozen runpy>", line 291, in run_path
  File "<frozen runpy>", line 88, in _run_code
"""
# Rank 0 fails in the project's loops.py, called from the converted script.
RANK_0 = HARNESS_FRAMES + """\
  File "/tmp/autoaccel-verify-x/converted/train.py", line 40, in <module>
    check(x)
  File "/home/me/project/loops.py", line 12, in check
    assert batch.shape[0] == 99, f"unexpected batch of {batch.shape[0]}"
           ^^^^^^^^^^^^^^^^^^^^
AssertionError: unexpected batch of 4
"""
# Rank 1 waited in a collective: its peer is gone.
RANK_1 = HARNESS_FRAMES + f"""\
  File "/tmp/autoaccel-verify-x/converted/train.py", line 35, in <module>
    loss.backward()
  File "{TORCH}/_tensor.py", line 625, in backward
    torch.autograd.backward(
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer [127.0.0.1]:5301
"""
TORCHRUN = f"""\
W1127 07:44:25.508000 560 {TORCH}/distributed/elastic/multiprocessing/api.py:1028] Sending process 575 closing signal SIGTERM
Traceback (most recent call last):
  File "{TORCH}/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
"""
ASSERTION = "error: AssertionError: unexpected batch of 4"
RESET = "error: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer"
ORIGINAL = Run({"losses": [1.0, 0.9], "exit": "max-steps"}, 0, "")


def refusals(conversion: Conversion) -> list[Skipped]:
    return [item for item in conversion.log.skipped if item.wrong]


def _record(rank: int, exit: str) -> dict:
    return {"rank": rank, "exit": exit, "losses": []}


def _finished(log: str, *ranks: dict) -> str:
    """The detail of the failed `every process finishes` check."""
    (check,) = checks(
        ORIGINAL,
        Run({"losses": [], "exit": ranks[0]["exit"] if ranks else "ok"}, 1, log, list(ranks)),
    )
    assert check.name == "every process finishes" and not check.passed
    return check.detail


@pytest.mark.parametrize(
    "log",
    [RANK_0 + RANK_1 + TORCHRUN, RANK_1 + RANK_0 + TORCHRUN],
    ids=["root-first", "consequence-first"],
)
def test_a_crash_names_the_process_that_failed_first_and_its_line(log):
    """Before: rank 1's record came first when rank 0's was lost, and the output's tail
    was rank 1's "Connection reset by peer" and torchrun's summary."""
    detail = _finished(log, _record(0, ASSERTION), _record(1, RESET))
    assert (
        detail == "/home/me/project/loops.py:12: AssertionError: unexpected batch of 4 (process 0)"
    )


def test_a_process_killed_before_its_record_is_named_from_its_traceback():
    """No record of either process (torchrun's SIGTERM, an abort): `error: exit code 1`
    before."""
    detail = _finished(RANK_1 + RANK_0 + TORCHRUN, _record(0, "error: exit code 1"))
    assert detail == "/home/me/project/loops.py:12: AssertionError: unexpected batch of 4"


def test_an_error_inside_torch_is_named_at_the_line_of_the_script_that_called_it():
    inside_torch = HARNESS_FRAMES + f"""\
  File "/tmp/autoaccel-verify-x/converted/train.py", line 52, in <module>
    optimizer.load_state_dict(state)
  File "{TORCH}/optim/optimizer.py", line 880, in load_state_dict
    value = saved_groups[0]["params"][index]
KeyError: 0
"""
    detail = _finished(inside_torch + RANK_1, _record(0, "error: KeyError: 0"), _record(1, RESET))
    assert detail == "/tmp/autoaccel-verify-x/converted/train.py:52: KeyError: 0 (process 0)"


def test_a_buffer_ddp_cannot_broadcast_is_explained():
    """Eleventh unseen set (transformer-time-series): a positional encoding registered as
    `pe.unsqueeze(0).transpose(0, 1)` fails DDP's buffer broadcast with a message that does
    not name the buffer; the refusal says what it means and what to do."""
    error = (
        "RuntimeError: unsupported operation: some elements of the input tensor and the"
        " written-to tensor refer to a single memory location. Please clone() the tensor"
        " before performing the operation."
    )
    broadcast = HARNESS_FRAMES + f"""\
  File "/tmp/autoaccel-verify-x/converted/train.py", line 61, in <module>
    output = ddp_model(data)
  File "{TORCH}/nn/parallel/distributed.py", line 2363, in _distributed_broadcast_coalesced
    dist._broadcast_coalesced(
{error}
"""
    detail = _finished(broadcast + RANK_1, _record(0, f"error: {error}"), _record(1, RESET))
    assert detail.startswith(f"/tmp/autoaccel-verify-x/converted/train.py:61: {error} (process 0):")
    assert "register a contiguous copy (`.clone(memory_format=torch.contiguous_format)`)" in detail
    assert "`broadcast_buffers=False`" in detail


def test_an_in_place_op_on_a_sharded_block_s_output_is_explained():
    """Twelfth unseen set (VQ-VAE's residual blocks under FSDP): autograd's message names
    FSDP's internal function, not the `inplace=True` that causes it."""
    error = (
        "RuntimeError: Output 0 of RegisterPostBackwardFunction is a view and is being modified"
        " inplace. This view was created inside a custom Function"
    )
    crash = HARNESS_FRAMES + f"""\
  File "/home/me/project/modules.py", line 107, in forward
    return x + self.block(x)
{error}
"""
    detail = _finished(crash + RANK_1, _record(0, f"error: {error}"), _record(1, RESET))
    assert detail.startswith("/home/me/project/modules.py:107: RuntimeError: Output 0")
    assert "make that operation out of place (`inplace=False`)" in detail


def test_a_sharded_model_saved_whole_is_explained():
    """Twelfth unseen set (icpm's Solver): `torch.save(self.model, path)` under FSDP."""
    error = (
        "PicklingError: Can't pickle <class 'torch.distributed.fsdp._fully_shard._fsdp_init."
        "FSDPWideResNet'>: attribute lookup FSDPWideResNet failed"
    )
    crash = HARNESS_FRAMES + f"""\
  File "/home/me/project/main.py", line 132, in save
    torch.save(self.model, model_out_path)
{error}
"""
    detail = _finished(crash + RANK_1, _record(0, f"error: {error}"), _record(1, RESET))
    assert "save its state dict instead (`torch.save(model.state_dict(), path)`" in detail


def test_only_consequences_keep_the_first_error():
    assert _finished(RANK_1 + TORCHRUN, _record(0, RESET), _record(1, RESET)) == RESET


def test_tracebacks_are_read_one_by_one_with_their_frames():
    found = crashes(RANK_0 + RANK_1 + TORCHRUN)
    assert [(crash.exception.split(":")[0], crash.consequence) for crash in found] == [
        ("AssertionError", False), ("RuntimeError", True), ("ChildFailedError", True),
    ]  # fmt: skip
    assert found[0].frames[-2:] == (
        ("/tmp/autoaccel-verify-x/converted/train.py", 40),
        ("/home/me/project/loops.py", 12),
    )


def test_a_line_of_the_converted_copy_is_named_as_the_users_line(tmp_path, monkeypatch):
    """The proof runs a copy in a scratch folder, with lines the conversion added: a
    frame there is named with the user's file and line, as is a module of the project's
    copy."""
    project, converted = tmp_path / "project", tmp_path / "scratch" / "converted"
    for folder in (project / "lib", converted / "lib"):
        folder.mkdir(parents=True)
    (project / "train.py").write_text("import torch\nx = 1\nrun(x)\n")
    (converted / "train.py").write_text("import os\nimport torch\n\nRANK = 0\nx = 1\nrun(x)\n")
    for root in (project, converted):
        (root / "lib" / "loops.py").write_text("def run(x):\n    assert x == 2\n")
    monkeypatch.chdir(project)
    place = user_place(project / "train.py", converted / "train.py", converted)
    assert place(str(converted / "train.py"), 6) == "train.py:3"
    # a line the conversion added is named so: the fault is the conversion's
    assert place(str(converted / "train.py"), 4) == "train.py:2 (in code the conversion added)"
    assert place(str(converted / "lib" / "loops.py"), 2) == os.path.join("lib", "loops.py") + ":2"
    assert place(f"{TORCH}/nn/modules/module.py", 1778) is None
    assert place("<frozen runpy>", 88) is None


GRAPH = """\
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
writer = torch.utils.tensorboard.SummaryWriter("runs")
writer.add_graph(model, torch.randn(1, 4))
"""


def test_a_graph_traced_from_the_sharded_model_on_rank_zero_is_refused_at_its_line():
    """The writer is made on rank 0 only, so `add_graph` ran a forward of the sharded model
    there alone: its parameter gathering waited for the other processes, and the proof
    failed with no line named."""
    conversion = convert(GRAPH)
    (skip,) = refusals(conversion)
    assert (
        skip.line
        == conversion.original.splitlines().index("    writer.add_graph(model, torch.randn(1, 4))")
        + 1
    )
    assert skip.reason.startswith(
        "`writer.add_graph(model, ...)` runs the sharded model on rank 0 only"
    )
    assert "run it before the model is sharded" in skip.reason


def test_a_traced_export_under_a_rank_test_is_refused():
    after = 'if torch.distributed.get_rank() == 0:\n    torch.onnx.export(model, torch.randn(1, 4), "m.onnx")\n'
    found = refusals(
        convert("model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", after)
    )
    assert [item.reason.split(" runs ")[0] for item in found] == ["`torch.onnx.export(model, ...)`"]


def test_a_graph_of_another_model_or_under_ddp_is_kept():
    other = GRAPH.replace("writer.add_graph(model,", "writer.add_graph(torch.nn.Linear(4, 4),")
    assert not refusals(convert(other))
    assert not refusals(convert(GRAPH, options=ConvertOptions(target="ddp", amp="off")))


def test_the_global_batch_size_in_the_step_points_at_per_process_batch():
    source = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader

        batch_size = 32
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(torch.randn(256, 4), batch_size=batch_size, shuffle=True)
        for x in loader:
            labels = torch.arange(batch_size)
            loss = torch.nn.functional.cross_entropy(model(x), labels % 4)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)
    (skip,) = refusals(convert_source(source, ConvertOptions(target="ddp", amp="off"), "train.py"))
    assert skip.line == 9
    assert (
        "convert with `--per-process-batch` (each process then loads `batch_size` samples"
        in skip.reason
    )
    kept = convert_source(
        source, ConvertOptions(target="ddp", amp="off", per_process_batch=True), "train.py"
    )
    assert not refusals(kept)
