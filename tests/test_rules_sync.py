"""Behaviour of the sync/memory rules ACC203-ACC206 and ACC301 beyond their examples."""

from __future__ import annotations

from textwrap import dedent, indent

import pytest

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source
from autoaccel.lint.rule import Applicability

CUDA_HEAD = """\
import torch
from torch import nn

model = nn.Linear(4, 2).cuda()
criterion = nn.CrossEntropyLoss()
"""


def settings(code: str, unsafe: bool = True) -> LintSettings:
    return LintSettings(select=(code,), unsafe_fixes=unsafe)


def found(source: str, code: str) -> list:
    return [d for d in lint_source(dedent(source), settings(code)) if d.code == code]


def fixed(source: str, code: str, unsafe: bool = True) -> str:
    return fix_source(dedent(source), settings(code, unsafe)).source


# -- ACC203 loss-accumulated-with-graph --------------------------------------------------
TRAIN_LOOP = """\
import torch
total = 0.0
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    total += loss
{after}
"""


@pytest.mark.parametrize(
    ("after", "safe"),
    [
        pytest.param("print(total.item())", True, id="item"),
        pytest.param("print((total / len(loader)).item())", True, id="divided-then-item"),
        pytest.param("print(f'{total:.3f}')", True, id="f-string-with-spec"),
        pytest.param("mean = float(total) / len(loader)", True, id="float"),
        pytest.param("best = total < best", True, id="comparison"),
        pytest.param("", True, id="never-read"),
        pytest.param("print(total)", False, id="printed-as-a-tensor"),
        pytest.param("print(f'{total}')", False, id="f-string-without-spec"),
        pytest.param("avg = total / len(loader)", False, id="divided-and-kept"),
        pytest.param("best = min(best, total)", False, id="builtin-kept"),
        pytest.param("torch.save(total, 'loss.pt')", False, id="torch-function"),
        pytest.param("log(total)", False, id="unknown-function"),
        pytest.param("print(total.grad_fn)", False, id="graph-attribute"),
    ],
)
def test_acc203_fix_is_detach_and_safe_only_when_read_as_a_number(after, safe):
    source = TRAIN_LOOP.format(after=after)
    (finding,) = found(source, "ACC203")
    assert finding.fix_applicability is (Applicability.SAFE if safe else Applicability.UNSAFE)
    assert "total += loss.detach()" in fixed(source, "ACC203")
    assert ("total += loss.detach()" in fixed(source, "ACC203", unsafe=False)) is safe


def test_acc203_sum_returned_from_its_function_is_unsafe():
    source = """\
    import torch
    def train():
        total = 0.0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            total += loss
        return total
    """
    (finding,) = found(source, "ACC203")
    assert finding.fix_applicability is Applicability.UNSAFE


@pytest.mark.parametrize(
    "backward", ["total.backward()", "(total / 4).backward()", "scaler.scale(total / 4).backward()"]
)
def test_acc203_sum_that_is_backpropagated_is_not_reported(backward):
    source = f"""\
    import torch
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        total = total + loss
        if i % 4 == 3:
            {backward}
            total = 0
    """
    assert found(source, "ACC203") == []


def test_acc203_fixed_script_still_reads_the_sum_as_a_tensor():
    # `.item()` made `total` a float and the later `avg.item()` raise AttributeError.
    source = """\
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    criterion = torch.nn.MSELoss()
    loader = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(3)]
    total = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        total += loss
    avg = total / len(loader)
    result = (avg.item(), model.weight.grad.clone())
    """
    after = fixed(source, "ACC203")
    assert "total += loss.detach()" in after
    before_ns, after_ns = {}, {}
    exec(dedent(source), before_ns)
    exec(after, after_ns)
    assert after_ns["result"][0] == before_ns["result"][0]
    assert after_ns["result"][1].equal(before_ns["result"][1])
    assert after_ns["total"].grad_fn is None and before_ns["total"].grad_fn is not None


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(
            """\
            loss = criterion(out, y)
            prior_loss = criterion(prior, y)
            loss = loss + weight * prior_loss
            accelerator.backward(loss)
            """,
            id="prior-preservation",
        ),
        pytest.param(
            """\
            if use_prior:
                prior_loss = criterion(prior, y)
            if snr is None:
                loss = criterion(out, y)
            else:
                loss = criterion(out, y).mean()
            if use_prior:
                loss = loss + weight * prior_loss
            (loss * 2).backward()
            """,
            id="terms-in-branches",
        ),
        pytest.param(
            """\
            total = 0
            for head in heads:
                total += criterion(head(out), y)
            out.sum().backward()
            print(total.item())
            """,
            id="sum-over-heads",
        ),
    ],
)
def test_acc203_sum_within_one_step_is_not_reported(step):
    head = "import torch\ncriterion = torch.nn.MSELoss()\n"
    source = (
        head + "for x, y in loader:\n    out, prior = model(x)\n" + indent(dedent(step), "    ")
    )
    assert found(source, "ACC203") == []


@pytest.mark.parametrize(
    "imports, call",
    [
        ("import torch.nn.functional as F", "F.cross_entropy(out, y)"),
        ("from torch.nn import functional as F", "F.nll_loss(out, y)"),
        ("from torch.nn.functional import mse_loss", "mse_loss(out, y)"),
    ],
)
def test_acc203_functional_losses_in_every_import_spelling(imports, call):
    source = f"""\
    {imports}
    for x, y in loader:
        out = model(x)
        optimizer.step()
        out.sum().backward()
        losses.append({call})
    """
    assert "losses.append(" + call + ".detach())" in fixed(source, "ACC203")


def test_acc203_not_a_torch_loss_function():
    source = """\
    from mylib import cross_entropy
    for x, y in loader:
        out = model(x)
        out.sum().backward()
        losses.append(cross_entropy(out, y))
    """
    assert found(source, "ACC203") == []


def test_acc203_in_a_trainer_class_with_a_grad_scaler():
    source = """\
    import torch
    class Trainer:
        def train_epoch(self):
            for x, y in self.loader:
                loss = self.criterion(self.model(x), y)
                self.scaler.scale(loss).backward()
                self.total = self.total + loss
            return self.total.item()
    """
    assert "self.total = self.total + loss.detach()" in fixed(source, "ACC203")


def test_acc203_sum_reset_only_in_a_logging_branch_is_still_reported():
    source = """\
    import torch
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        total += loss
        if step % 100 == 0:
            print(total / 100)
            total = 0
    """
    assert len(found(source, "ACC203")) == 1


def test_acc203_noqa():
    source = TRAIN_LOOP.format(after="").replace("total += loss", "total += loss  # noqa: ACC203")
    assert found(source, "ACC203") == []


# -- ACC204 host-sync-every-step ---------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        "running += loss.item()",
        "history.append(float(loss))",
        "preds.extend(out.argmax(1).tolist())",
        "arr = out.detach().cpu()",
        "print(loss)",
        "print('loss %.3f' % loss)",
        "print('loss {:.3f}'.format(loss))",
        "acc = (out.argmax(1) == y.cuda()).float().mean().item()",
    ],
)
def test_acc204_reports_syncs_of_device_tensors(line):
    source = CUDA_HEAD + (
        "for x, y in loader:\n"
        "    out = model(x.cuda())\n"
        "    loss = criterion(out, y.cuda())\n"
        "    loss.backward()\n"
        f"    {line}\n"
    )
    (finding,) = found(source, "ACC204")
    assert finding.line == 10
    assert "`.detach()`" in finding.message and "every N steps" in finding.message
    assert finding.fix is None


@pytest.mark.parametrize(
    "gate",
    [
        "if step % 50 == 0:",
        "if step > 0 and step % args.log_every == 0:",
        "if step == len(loader) - 1:",
        "if global_step >= 1000:",
    ],
)
def test_acc204_logging_interval_gates(gate):
    source = CUDA_HEAD + (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    global_step += 1\n"
        f"    {gate}\n"
        "        print(f'loss {loss.item():.4f}')\n"
    )
    assert found(source, "ACC204") == []


def test_acc204_gate_on_something_else_still_reports():
    source = CUDA_HEAD + (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    if args.verbose:\n"
        "        print(loss.item())\n"
    )
    assert len(found(source, "ACC204")) == 1


def test_acc204_python_numbers_and_cpu_values_are_not_reported():
    source = CUDA_HEAD + (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    lr = scheduler.get_last_lr()[0]\n"
        "    print(lr)\n"
        "    labels = y.numpy()\n"
        "    loss = 0.0\n"
        "    print(loss)\n"
    )
    # `loss` is rebound to a float, so `print(loss)` is not a sync we can be sure of.
    assert found(source, "ACC204") == []


def test_acc204_trainer_method_with_self_model():
    source = """\
    import torch
    class Trainer:
        def __init__(self):
            self.model = torch.nn.Linear(4, 2).cuda()
        def fit(self):
            for x, y in self.loader:
                out = self.model(x)
                out.mean().backward()
                self.losses.append(out.mean().item())
    """
    assert [d.line for d in found(source, "ACC204")] == [9]


# -- ACC205 empty-cache-in-loop ----------------------------------------------------------
def test_acc205_keeps_the_comment_above_the_call():
    source = """\
    import torch
    for x in data:
        model(x).sum().backward()
        # free what the step cached
        torch.cuda.empty_cache()
        log(x)
    """
    assert fixed(source, "ACC205") == dedent("""\
        import torch
        for x in data:
            model(x).sum().backward()
            # free what the step cached
            log(x)
        """)


def test_acc205_inside_a_function():
    source = """\
    import torch.cuda
    def train():
        for step in range(100):
            model(step).backward()
            torch.cuda.empty_cache()  # keep nvidia-smi low
    """
    assert fixed(source, "ACC205") == dedent("""\
        import torch.cuda
        def train():
            for step in range(100):
                model(step).backward()
        """)


def test_acc205_after_a_periodic_validation_is_not_reported():
    source = """\
    import torch
    for step, batch in enumerate(loader):
        model(batch).backward()
        if step % 500 == 0:
            pipeline = make_pipeline(model)
            validate(pipeline)
            del pipeline
            torch.cuda.empty_cache()
    """
    assert found(source, "ACC205") == []


def test_acc205_noqa():
    source = "import torch\nfor x in data:\n    x.backward()\n    torch.cuda.empty_cache()  # noqa: ACC205\n"
    assert found(source, "ACC205") == []


# -- ACC206 cpu-tensor-moved-to-device ---------------------------------------------------
# ACC206 reports a tensor made every step: each source is the body of a training step.
ACC206_STEP = "import torch{}\nfor x in loader:\n    {}\n    model(x).sum().backward()\n"


def test_acc206_random_factory_fix_is_unsafe():
    source = ACC206_STEP.format("", "noise = torch.randn(4, 100).cuda()")
    (finding,) = found(source, "ACC206")
    assert finding.fix_applicability is Applicability.UNSAFE
    assert fixed(source, "ACC206", unsafe=False) == source
    assert fixed(source, "ACC206") == ACC206_STEP.format(
        "", 'noise = torch.randn(4, 100, device="cuda")'
    )


def test_acc206_deterministic_factory_fix_is_safe():
    source = ACC206_STEP.format(" as T", "mask = T.full((4, 4), 1.0).cuda()")
    assert fixed(source, "ACC206", unsafe=False) == ACC206_STEP.format(
        " as T", 'mask = T.full((4, 4), 1.0, device="cuda")'
    )


def test_acc206_move_with_device_index_is_reported_without_fix():
    source = ACC206_STEP.format("", "z = torch.zeros(8).cuda(1)")
    (finding,) = found(source, "ACC206")
    assert finding.fix is None
    assert "torch.zeros" in finding.message


def test_acc206_keeps_existing_keywords_and_layout():
    source = """\
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for x in loader:
        label = torch.full(
            (batch_size,),
            real_label,
            dtype=torch.float,
        ).to(device)
        model(x).sum().backward()
    """
    assert fixed(source, "ACC206") == dedent("""\
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        for x in loader:
            label = torch.full(
                (batch_size,),
                real_label,
                dtype=torch.float,
                device=device,
            )
            model(x).sum().backward()
        """)


# -- ACC301 missing-autocast -------------------------------------------------------------
# A layer wide enough for mixed precision to pay (ACC301 leaves narrow models alone).
TWO_LOOPS = CUDA_HEAD.replace("nn.Linear(4, 2)", "nn.Linear(1024, 1024)") + """\
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
for x, y in other_loader:
    loss = criterion(model(x), y)
    loss.backward()
"""


def test_acc301_reported_once_at_the_first_model_call():
    (finding,) = found(TWO_LOOPS, "ACC301")
    assert (finding.line, finding.column) == (8, 22)
    assert "autoaccel convert --amp bf16" in finding.message
    assert finding.fix is None


@pytest.mark.parametrize(
    "spelling",
    [
        "from torch import amp\nctx = amp.autocast('cuda')\n",
        "from torch.cuda.amp import autocast as ac\n",
        "scaler = torch.amp.GradScaler('cuda')\n",
        "model = model.to(dtype=torch.bfloat16)\n",
        "use_amp = args.amp\n",
    ],
)
def test_acc301_scripts_that_choose_their_precision(spelling):
    assert found(TWO_LOOPS + spelling, "ACC301") == []


def test_acc301_noqa_on_the_reported_line():
    source = TWO_LOOPS.replace(
        "    loss = criterion(model(x), y)\n",
        "    loss = criterion(model(x), y)  # noqa: ACC301\n",
        1,
    )
    assert found(source, "ACC301") == []
