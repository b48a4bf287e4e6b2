"""ACC207: `torch.cuda.synchronize()` on every training (or evaluation) step."""

from __future__ import annotations

from collections.abc import Iterable
from textwrap import indent

import libcst as cst

from autoaccel.analysis.script_model import LoopRole
from autoaccel.analysis.shapes import find, is_method_call
from autoaccel.lint.removal import call_statement_removal
from autoaccel.lint.rule import Applicability, Invalid, LintRule

# Device-wide waits. `torch.cpu.synchronize()` is a no-op kept for device-generic code.
SYNCHRONIZE = (
    "torch.cuda.synchronize",
    "torch.accelerator.synchronize",
    "torch.xpu.synchronize",
    "torch.mps.synchronize",
)
# `torch.cuda.current_stream().synchronize()`: the stream every kernel of the step runs
# on, so the same wait. Streams and events held in names are left alone: a side stream
# or an event is synchronised on purpose (overlapping copies, timing).
CURRENT_STREAM = (
    "torch.cuda.current_stream",
    "torch.cuda.default_stream",
    "torch.accelerator.current_stream",
    "torch.xpu.current_stream",
)
# Reading one of these right before or after the wait times the device's work.
CLOCKS = frozenset(
    f"time.{name}"
    for name in (
        "time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns",
        "process_time", "process_time_ns",
    )
) | {"timeit.default_timer", "datetime.datetime.now", "datetime.datetime.utcnow"}  # fmt: skip
_STEP = "import torch\nfor x, y in loader:\n    loss = model(x).sum()\n    loss.backward()\n"


class SynchronizeEveryStep(LintRule):
    code = "ACC207"
    name = "synchronize-every-step"
    message = (
        "`torch.cuda.synchronize()` on every training step makes the CPU wait until the GPU "
        "has run all queued work"
    )
    fix_title = "Remove the `torch.cuda.synchronize()` call"
    applicability = Applicability.UNSAFE

    VALID = [
        # Once, after training.
        _STEP + "torch.cuda.synchronize()\n",
        # Once per epoch, around the step loop.
        "import torch\nfor epoch in range(3):\n"
        + indent(_STEP, "    ")
        + "    torch.cuda.synchronize()\n",
        # Timing a step: the wait is what makes the clock measure the GPU's work.
        "import time\n" + _STEP + "    torch.cuda.synchronize()\n"
        "    batch_time.update(time.time() - end)\n    end = time.time()\n",
        "import time\n" + _STEP + "    torch.cuda.synchronize(); t0 = time.perf_counter()\n",
        "import time\n" + _STEP + "    start = time.perf_counter()\n    torch.cuda.synchronize()\n",
        _STEP + "    end_event.record()\n    torch.cuda.synchronize()\n"
        "    ms = start_event.elapsed_time(end_event)\n",
        # On logging steps only, or when the script is asked to measure.
        "import torch\nfor step, (x, y) in enumerate(loader):\n    model(x).sum().backward()\n"
        "    if step % 100 == 0:\n        torch.cuda.synchronize()\n",
        _STEP + "    if args.profile:\n        torch.cuda.synchronize()\n",
        # A loop that neither trains nor reads batches (a benchmark of the model).
        "import torch\nfor _ in range(100):\n    model(x)\n    torch.cuda.synchronize()\n",
        # A function that is not called every step.
        "import torch\ndef log_memory():\n    torch.cuda.synchronize()\n    print(used())\n"
        + _STEP
        + "    if step % 100 == 0:\n        log_memory()\n",
        # Some other `synchronize`: the CPU's no-op, a user's own, a stream held in a name.
        _STEP + "    torch.cpu.synchronize()\n",
        "from mylib import cuda\n" + _STEP + "    cuda.synchronize()\n",
        _STEP + "    copy_stream.synchronize()\n",
    ]
    INVALID = [
        Invalid(_STEP + "    torch.cuda.synchronize()\n", fixed=_STEP),
        Invalid(
            "from torch.cuda import synchronize\nwhile True:\n    model(x).sum().backward()\n"
            "    synchronize()\n",
            fixed="from torch.cuda import synchronize\nwhile True:\n"
            "    model(x).sum().backward()\n",
        ),
        Invalid(
            "import torch as t\nfor x in data:\n"
            "    model(x).sum().backward(); t.cuda.synchronize()\n",
            fixed="import torch as t\nfor x in data:\n    model(x).sum().backward()\n",
        ),
        Invalid(_STEP + "    torch.accelerator.synchronize()\n", fixed=_STEP),
        Invalid(_STEP + "    torch.cuda.current_stream().synchronize()\n", fixed=_STEP),
        # On every step but the logging ones; and under a test that holds on every step.
        Invalid(
            "import torch\nfor step, (x, y) in enumerate(loader):\n    model(x).sum().backward()\n"
            "    if step % 100 == 0:\n        print(step)\n"
            "    else:\n        torch.cuda.synchronize()\n"
        ),
        Invalid(_STEP + "    if torch.cuda.is_available():\n        torch.cuda.synchronize()\n"),
        # In the function the step calls.
        Invalid(
            "import torch\ndef train_step(x):\n    model(x).sum().backward()\n"
            "    torch.cuda.synchronize()\nfor x, y in loader:\n    train_step(x)\n"
        ),
        # Per batch of an evaluation loop.
        Invalid(
            "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(ds)\n"
            "with torch.no_grad():\n    for x, y in loader:\n"
            "        correct += (model(x) == y).sum()\n        torch.cuda.synchronize()\n"
        ),
        # Used as a value: reported, not removed.
        Invalid(_STEP + "    done = torch.cuda.synchronize()\n"),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        spelling = self._synchronize(node)
        if spelling is None or self._times(node):
            return
        role, only = self.script.every_step(node)
        if role is None:
            return
        where = "training step" if role is LoopRole.TRAIN else "evaluation batch"
        self.report(
            node,
            f"`{spelling}` on every {where} makes the CPU wait until the GPU has run all queued "
            f"work, and the GPU idle while Python prepares the next {where.split()[-1]}",
            # A function that also runs elsewhere (a timing helper) keeps its wait there.
            edits=call_statement_removal(self, node) if only else {},
            fix_title=f"Remove the `{spelling}` call",
        )

    def _synchronize(self, call: cst.Call) -> str | None:
        """How the message names the wait `call` makes, if it makes one."""
        names = self.qualified_names(call.func)
        found = next((name for name in SYNCHRONIZE if name in names), None)
        if found is not None:
            return f"{found}()"
        func = call.func
        if (
            is_method_call(call, "synchronize")
            and isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Call)
            and self.calls(func.value, *CURRENT_STREAM)
        ):
            stream = next(n for n in CURRENT_STREAM if n in self.qualified_names(func.value.func))
            return f"{stream}().synchronize()"
        return None

    # -- timing ----------------------------------------------------------------------------
    def _times(self, call: cst.Call) -> bool:
        """Whether the first statement with a call before or after the wait reads a clock
        (`time.time()`, `start.elapsed_time(end)`), past bookkeeping without calls
        (`num_updates += 1`) but not into or past a block: the wait makes the clock see
        the device's work (timm's `torch.cuda.synchronize()`, `num_updates += 1`,
        `batch_time_m.update(time.time() - end)`)."""
        small = next(
            (a for a in self.ancestors(call) if isinstance(a, cst.BaseSmallStatement)), None
        )
        line = self.parent(small) if small is not None else None
        if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return False
        block = self.parent(line)
        statements = (
            block.body
            if isinstance(line, cst.SimpleStatementLine)
            and isinstance(block, (cst.IndentedBlock, cst.Module))
            else [line]
        )
        # The small statements around the wait, in order; None for a block.
        sequence: list[cst.BaseSmallStatement | None] = []
        for statement in statements:
            if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                sequence.extend(statement.body)
            else:
                sequence.append(None)
        at = sequence.index(small)  # type: ignore[arg-type]
        return any(
            self._first_with_call_reads_clock(side)
            for side in (reversed(sequence[:at]), sequence[at + 1 :])
        )

    def _first_with_call_reads_clock(self, statements: Iterable[cst.CSTNode | None]) -> bool:
        for statement in statements:
            if statement is None:
                return False
            calls = find(statement, cst.Call)
            if calls:
                return any(
                    is_method_call(c, "elapsed_time") or self.calls(c, *CLOCKS) for c in calls
                )
        return False
