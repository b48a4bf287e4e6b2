"""ACC207 synchronize-every-step beyond its examples: where a wait runs on every step
(the loop, a function the step calls, another module), and the waits that are left
alone (timing, logging intervals, set-up, once per epoch)."""

from __future__ import annotations

from textwrap import dedent

import pytest

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source
from autoaccel.lint.rule import Applicability

CODE = "ACC207"


def found(source: str) -> list:
    settings = LintSettings(select=(CODE,), unsafe_fixes=True)
    return [d for d in lint_source(dedent(source), settings) if d.code == CODE]


def lines(source: str) -> list[int]:
    return [d.line for d in found(source)]


def fixed(source: str, unsafe: bool = True) -> str:
    return fix_source(dedent(source), LintSettings(select=(CODE,), unsafe_fixes=unsafe)).source


STEP = """\
import time
import torch
from torch import nn

model = nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


# -- reported -----------------------------------------------------------------------------
def test_reported_on_every_step_with_an_unsafe_fix():
    source = STEP + dedent("""\
        for x, y in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
    """)
    (diagnostic,) = found(source)
    assert (diagnostic.line, diagnostic.column) == (11, 5)
    assert diagnostic.message.startswith("`torch.cuda.synchronize()` on every training step")
    assert diagnostic.fix_applicability is Applicability.UNSAFE
    assert fixed(source, unsafe=False) == source
    assert fixed(source) == source.replace("    torch.cuda.synchronize()\n", "")


def test_reported_in_the_step_function_and_the_method_the_loop_calls():
    source = STEP + dedent("""\
        def train_step(x):
            model(x).sum().backward()
            torch.cuda.synchronize()

        class Trainer:
            def run(self, loader):
                for x, y in loader:
                    self.step(x)

            def step(self, x):
                train_step(x)
                optimizer.step()
                self.sync()

            def sync(self):
                torch.cuda.synchronize()

        Trainer().run(loader)
    """)
    assert lines(source) == [9, 22]


def test_a_function_that_also_runs_elsewhere_keeps_its_wait():
    # `sync()` also serves the benchmark after training: reported, but not removed.
    source = STEP + dedent("""\
        def sync():
            torch.cuda.synchronize()

        def train_step(x):
            model(x).sum().backward()
            torch.cuda.synchronize()

        for x, y in loader:
            train_step(x)
            sync()
        sync()
        t0 = time.perf_counter()
    """)
    assert [(d.line, d.fix is not None) for d in found(source)] == [(8, False), (12, True)]


def test_a_comment_above_the_wait_stays():
    # dino's main_dino.py: `# logging`, the wait, then the metric logger's update.
    source = STEP + dedent("""\
        for it, (images, _) in enumerate(data_loader):
            loss = model(images.cuda()).sum()
            loss.backward()
            optimizer.step()
            # logging
            torch.cuda.synchronize()
            metric_logger.update(loss=loss.item())
    """)
    assert fixed(source) == source.replace("    torch.cuda.synchronize()\n", "")


def test_the_only_statement_of_a_block_becomes_pass():
    source = STEP + dedent("""\
        for x, y in loader:
            model(x).sum().backward()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
    """)
    assert fixed(source).endswith("    if torch.cuda.is_available():\n        pass\n")


def test_reported_per_batch_of_evaluation():
    source = STEP + dedent("""\
        from torch.utils.data import DataLoader
        val_loader = DataLoader(val_set, batch_size=64)
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x.cuda()).argmax(1) == y.cuda()).sum()
                torch.cuda.synchronize()
    """)
    (diagnostic,) = found(source)
    assert "every evaluation batch" in diagnostic.message


def test_reported_in_a_module_the_entry_script_calls(cli, tmp_path):
    # A research layout: `main.py` builds everything, `engine.py` never says "cuda".
    (tmp_path / "engine.py").write_text(dedent("""\
        import torch

        def train_one_epoch(model, loader, optimizer):
            for x, y in loader:
                loss = model(x).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
    """))
    (tmp_path / "main.py").write_text(dedent("""\
        import torch
        from torch.utils.data import DataLoader
        from engine import train_one_epoch

        model = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(dataset, batch_size=32)
        for epoch in range(10):
            train_one_epoch(model, loader, optimizer)
    """))
    run = cli("lint", "--select", CODE, ".")
    assert run.stdout.startswith("engine.py:9:9: ACC207 `torch.cuda.synchronize()`"), run.stdout


# -- not reported ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        # timm / deit: the wait makes the batch timer see the GPU's work.
        "torch.cuda.synchronize()\nbatch_time.update(time.time() - end)\nend = time.time()\n",
        "torch.cuda.synchronize()\nstep_time = time.perf_counter() - t0\n",
        # timm: bookkeeping without calls between the wait and the clock.
        "torch.cuda.synchronize()\nnum_updates += 1\nbatch_time_m.update(time.time() - end)\n",
        "t0 = time.perf_counter(); torch.cuda.synchronize()\n",
        "end_event.record()\ntorch.cuda.synchronize()\nms = start_event.elapsed_time(end_event)\n",
    ],
    ids=["timer-after", "perf-counter-after", "timm", "clock-before", "cuda-events"],
)
def test_not_reported_in_a_timing_bracket(body):
    source = STEP + "for x, y in loader:\n    model(x).sum().backward()\n"
    source += "".join("    " + line + "\n" for line in body.splitlines())
    assert found(source) == []


def test_a_clock_read_after_other_work_does_not_exempt_the_wait():
    # A copy of timm's loop without its timer: the step's own work follows the wait.
    source = STEP + dedent("""\
        for batch_id, (x, y) in enumerate(loader):
            loss = model(x).sum()
            loss.backward()
            torch.cuda.synchronize()
            num_updates += 1
            running_loss += loss.item() * x.size(0)
            print(time.time() - start)
    """)
    assert lines(source) == [10]


def test_a_timer_read_under_the_next_if_does_not_exempt_the_wait():
    # The wait runs every step to serve a clock read on logging steps only.
    source = STEP + dedent("""\
        for i, (x, y) in enumerate(loader):
            model(x).sum().backward()
            torch.cuda.synchronize()
            if i % 50 == 0:
                print(time.time() - start)
    """)
    assert lines(source) == [9]


def test_not_reported_on_logging_steps_only():
    source = STEP + dedent("""\
        for i, (x, y) in enumerate(loader):
            model(x).sum().backward()
            if (i + 1) % args.print_freq == 0:
                torch.cuda.synchronize()
                print(torch.cuda.max_memory_allocated())
            if args.debug:
                torch.cuda.synchronize()
    """)
    assert found(source) == []


def test_a_function_called_on_logging_steps_only_is_not_reported():
    source = STEP + dedent("""\
        def log_memory():
            torch.cuda.synchronize()
            print(torch.cuda.memory_allocated())

        for step, (x, y) in enumerate(loader):
            model(x).sum().backward()
            if step % 100 == 0:
                log_memory()
    """)
    assert found(source) == []


def test_not_reported_at_set_up_per_epoch_or_after_training():
    source = STEP + dedent("""\
        torch.cuda.synchronize()

        def evaluate():
            with torch.no_grad():
                out = model(val_x)
            torch.cuda.synchronize()
            return out

        for epoch in range(10):
            for x, y in loader:
                model(x).sum().backward()
            torch.cuda.synchronize()
            evaluate()
        torch.cuda.synchronize()
    """)
    assert found(source) == []


def test_not_reported_in_a_loop_that_neither_trains_nor_reads_batches():
    source = STEP + dedent("""\
        for _ in range(10):
            model(x)
            torch.cuda.synchronize()
    """)
    assert found(source) == []


def test_a_recursive_function_is_followed_once():
    source = STEP + dedent("""\
        def walk(node):
            torch.cuda.synchronize()
            for child in node.children:
                walk(child)

        for x, y in loader:
            model(x).sum().backward()
            walk(tree)
    """)
    assert lines(source) == [8]


def test_noqa():
    source = STEP + dedent("""\
        for x, y in loader:
            model(x).sum().backward()
            torch.cuda.synchronize()  # noqa: ACC207
    """)
    assert found(source) == []
