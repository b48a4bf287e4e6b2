"""Behaviour of the legacy (PyTorch 0.3 era) rules ACC501-ACC505 beyond their examples.

The fixes are also what `autoaccel convert` uses to make 0.3 scripts run, so several
tests execute the fixed code on the installed PyTorch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from libcst.metadata import MetadataWrapper, ScopeProvider

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source
from running import run_script

torch = pytest.importorskip("torch")

LEGACY = ("ACC501", "ACC502", "ACC503", "ACC504", "ACC505")
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "legacy_pytorch03.py"


def settings(*codes: str) -> LintSettings:
    return LintSettings(select=codes or LEGACY, unsafe_fixes=True)


def found(source: str, *codes: str) -> list[str]:
    return [d.code for d in lint_source(textwrap.dedent(source), settings(*codes))]


def fixed(source: str, *codes: str) -> str:
    return fix_source(textwrap.dedent(source), settings(*codes)).source


def run(source: str) -> dict:
    """Execute fixed code; return its globals."""
    namespace: dict = {}
    exec(compile(source, "<fixed>", "exec"), namespace)
    return namespace


# -- ACC501 variable-wrapper ---------------------------------------------------------
@pytest.mark.parametrize(
    ("imports", "spelling"),
    [
        pytest.param("from torch.autograd import Variable", "Variable", id="from-import"),
        pytest.param("from torch.autograd import Variable as V", "V", id="from-import-as"),
        pytest.param("import torch.autograd as ag", "ag.Variable", id="module-alias"),
        pytest.param("import torch", "torch.autograd.Variable", id="full-path"),
        pytest.param("from torch import autograd", "autograd.Variable", id="from-torch"),
    ],
)
def test_variable_every_import_spelling(imports, spelling):
    source = f"import torch\n{imports}\nx = {spelling}(torch.ones(2))\n"
    assert found(source, "ACC501") == ["ACC501"]
    after = fixed(source, "ACC501")
    assert "Variable" not in after.replace("import torch.autograd as ag", "")
    assert "x = torch.ones(2)\n" in after
    assert run(after)["x"].tolist() == [1.0, 1.0]


def test_variable_user_class_is_not_reported():
    assert found("import torch\nclass Variable:\n    pass\nv = Variable(1)\n") == []


def test_variable_import_goes_only_after_the_last_use():
    source = """\
        import torch
        from torch.autograd import Variable, grad


        def step(a, b):
            a = Variable(a)
            return Variable(b) * a
        """
    after = fixed(source, "ACC501")
    assert after == textwrap.dedent("""\
        import torch
        from torch.autograd import grad


        def step(a, b):
            a = a.detach()
            return b.detach() * a
        """)
    assert run(after)["step"](torch.ones(2), torch.full((2,), 3.0)).tolist() == [3.0, 3.0]


def test_variable_import_stays_while_a_use_is_left():
    source = (
        "import torch\nfrom torch.autograd import Variable\n"
        "ok = isinstance(t, Variable)\ny = Variable(t)\n"
    )
    assert fixed(source, "ACC501") == (
        "import torch\nfrom torch.autograd import Variable\nok = isinstance(t, Variable)\n"
        "y = t.detach()\n"
    )


def test_variable_requires_grad_makes_a_new_leaf():
    source = """\
        import torch
        from torch.autograd import Variable
        base = torch.ones(3)
        w = Variable(base, requires_grad=True)
        h = Variable(torch.zeros(2), requires_grad=True)
        """
    after = fixed(source, "ACC501")
    assert "w = base.detach().requires_grad_()\n" in after
    assert "h = torch.zeros(2).requires_grad_()\n" in after
    result = run(after)
    assert result["w"].requires_grad and result["h"].requires_grad
    assert not result["base"].requires_grad  # like Variable: `base` itself is untouched


def test_variable_keeps_operator_precedence():
    after = fixed("from torch.autograd import Variable\ny = -Variable(a - b) ** 2\n", "ACC501")
    assert after == "y = -(a - b).detach() ** 2\n"


def test_variable_self_assignment_keeps_comments_above():
    source = """\
        from torch.autograd import Variable
        from torch.utils.data import DataLoader
        loader = DataLoader(dataset)
        for data, target in loader:
            # wrap the batch
            data, target = Variable(data), Variable(target)
            model(data).backward()
        """
    assert fixed(source, "ACC501") == textwrap.dedent("""\
        from torch.utils.data import DataLoader
        loader = DataLoader(dataset)
        for data, target in loader:
            # wrap the batch
            model(data).backward()
        """)


# What `Variable(...)` gives on today's torch, and what the fix writes instead, must
# agree: flags, values, and whether a backward through the result reaches the source.
VARIABLE_FORMS = """\
    import warnings
    import torch
    from torch.autograd import Variable
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    p = torch.nn.Parameter(torch.randn(2))
    h = lin(torch.randn(4, 3))
    v = {form}
"""


@pytest.mark.parametrize(
    "form",
    [
        pytest.param("Variable(h)", id="graph"),
        pytest.param("Variable(h, requires_grad=False)", id="graph-requires-grad-false"),
        pytest.param("Variable(h, requires_grad=True)", id="graph-requires-grad-true"),
        pytest.param("Variable(h.clone(), requires_grad=True)", id="clone-requires-grad"),
        pytest.param("Variable(h * 2 + 1)", id="expression"),
        pytest.param("Variable(p)", id="parameter"),
        pytest.param("Variable(torch.zeros(2, requires_grad=True))", id="factory-requires-grad"),
        pytest.param("Variable(torch.zeros(2))", id="factory"),
        pytest.param("Variable(h.data)", id="data"),
    ],
)
def test_variable_fix_gives_what_variable_gives(form):
    source = VARIABLE_FORMS.format(form=form)
    after = fixed(source, "ACC501")
    assert "Variable" not in after
    before_ns, after_ns = run(textwrap.dedent(source)), run(after)
    b, a = before_ns["v"], after_ns["v"]
    assert (a.requires_grad, a.is_leaf, type(a)) == (b.requires_grad, b.is_leaf, type(b))
    assert torch.equal(a, b)
    for ns in (before_ns, after_ns):
        if ns["v"].requires_grad:
            ns["v"].sum().backward()
    # A gradient reaches `lin` or `p` through the fixed form only where it did before.
    assert after_ns["lin"].weight.grad is None and before_ns["lin"].weight.grad is None
    assert (after_ns["p"].grad is None) == (before_ns["p"].grad is None)


def test_variable_of_a_model_output_becomes_detach():
    source = "import torch\nfrom torch.autograd import Variable\nh = lin(x)\nv = Variable(h)\n"
    (diagnostic,) = lint_source(source, settings("ACC501"))
    assert diagnostic.fix_title == "Replace `Variable(x)` with `x.detach()`"
    assert fixed(source, "ACC501") == "import torch\nh = lin(x)\nv = h.detach()\n"


LOADER_STEP = """\
import torch
from torch.autograd import Variable
from torch.utils.data import DataLoader
loader = DataLoader(dataset)
for data, target in loader:
{before}    data, target = Variable(data), Variable(target)
    model(data, target).backward()
"""


@pytest.mark.parametrize(
    "before",
    [
        pytest.param("", id="loop-target"),
        pytest.param("    data, target = data.cuda(), target.cuda()\n", id="moved"),
        pytest.param("    data = data.to(device).float().view(-1, 4)\n", id="method-chain"),
        pytest.param("    if cuda:\n        data = data.cuda()\n", id="moved-in-a-branch"),
    ],
)
def test_variable_of_a_loader_batch_goes(before):
    after = fixed(LOADER_STEP.format(before=before), "ACC501")
    assert "Variable" not in after and ".detach()" not in after
    assert "data, target = " not in after.replace("data, target = data.cuda()", "")


@pytest.mark.parametrize(
    "before",
    [
        pytest.param("    data.requires_grad_()\n", id="requires-grad-in-place"),
        pytest.param("    data.requires_grad = True\n", id="requires-grad-attribute"),
        pytest.param("    data = encoder(data)\n", id="encoded"),
        pytest.param("    data += noise\n", id="augmented"),
        pytest.param("    data[0] = h\n", id="item-assignment"),
        pytest.param("    data, target = batch\n", id="unpacked-from-elsewhere"),
        pytest.param("    for data in chunks:\n        pass\n", id="inner-loop"),
    ],
)
def test_variable_of_a_batch_the_step_changes_keeps_the_detach(before):
    after = fixed(LOADER_STEP.format(before=before), "ACC501")
    assert "data.detach()" in after


def test_variable_of_a_batch_without_a_dataloader_keeps_the_detach():
    source = LOADER_STEP.format(before="").replace("DataLoader(dataset)", "make_batches()")
    assert "data, target = data.detach(), target.detach()\n" in fixed(source, "ACC501")


def test_variable_in_a_nested_function_is_not_the_batch():
    source = LOADER_STEP.format(before="    def wrap(data):\n        return Variable(data)\n")
    assert "return data.detach()\n" in fixed(source, "ACC501")


def test_variable_noqa_keeps_the_call_and_its_import():
    source = "import torch\nfrom torch.autograd import Variable\nx = Variable(t)  # noqa: ACC501\n"
    assert found(source, "ACC501") == []
    assert fixed(source, "ACC501") == source


def test_variable_with_volatile_is_reported_not_fixed():
    source = "import torch\nfrom torch.autograd import Variable\nx = Variable(t, volatile=True)\n"
    (diagnostic,) = lint_source(source, settings("ACC501"))
    assert diagnostic.fix is None
    assert fixed(source, "ACC501") == source


# -- ACC502 volatile-variable ----------------------------------------------------------
def test_volatile_and_variable_together_leave_plain_code():
    source = """\
        import torch
        from torch.autograd import Variable
        loader = torch.utils.data.DataLoader(dataset)
        for data, target in loader:
            data, target = Variable(data, volatile=True), Variable(target)
            out = model(data)
            out.sum().backward()
        """
    after = fixed(source, "ACC501", "ACC502")
    assert "    data, target =" not in after and "Variable" not in after


def test_volatile_wrapper_of_what_may_have_a_graph_keeps_its_detach():
    """`Variable(h, volatile=True)` is `h.detach()` too: dropping it lets gradients through."""
    source = """\
        import torch
        from torch.autograd import Variable
        h = lin(x)
        v = Variable(h, volatile=True)
        """
    assert "v = h.detach()\n" in fixed(source, "ACC502")


def test_volatile_fix_runs_without_the_warning():
    source = """\
        import warnings
        import torch
        from torch.autograd import Variable
        warnings.simplefilter("error")
        x = Variable(torch.ones(2) * 2, volatile=True)
        """
    after = fixed(source, "ACC502")
    assert "x = torch.ones(2) * 2\n" in after
    assert run(after)["x"].tolist() == [2.0, 2.0]


def test_volatile_message_points_to_no_grad():
    (diagnostic,) = lint_source(
        "import torch\nx = torch.autograd.Variable(t, volatile=True)\n", settings("ACC502")
    )
    assert "torch.no_grad()" in diagnostic.message


# -- ACC503 zero-dim-index ----------------------------------------------------------------
# The legacy script uses `size_average=False` on purpose (pre-0.4 style); torch warns.
@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
def test_zero_dim_index_fix_runs_on_current_torch():
    source = """\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        out, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
        criterion = nn.CrossEntropyLoss()
        loss = criterion(out, y)
        a = loss.data[0]
        b = F.nll_loss(F.log_softmax(out, 1), y, size_average=False).data[0]
        c = (criterion(out, y) + 0.5 * F.mse_loss(out, out)).data[0]
        """
    with pytest.raises(IndexError):
        run(textwrap.dedent(source))
    after = fixed(source, "ACC503")
    assert after.count(".item()") == 3 and ".data[0]" not in after
    result = run(after)
    assert all(isinstance(result[name], float) for name in "abc")


def test_zero_dim_index_in_a_method_with_self_attribute():
    source = """\
        import torch.nn.functional as F
        class Trainer:
            def step(self, out, y):
                self.loss = F.mse_loss(out, y)
                self.loss.backward()
                return self.loss.data[0]
        """
    assert "return self.loss.item()\n" in fixed(source, "ACC503")


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("import torch\nrow = batch.data[0]\n", id="unknown-tensor"),
        pytest.param(
            "import torch.nn.functional as F\n"
            "loss = F.mse_loss(a, b, reduce=False)\nv = loss.data[0]\n",
            id="unreduced",
        ),
        pytest.param(
            "import torch.nn as nn\nopts = {'reduction': 'none'}\ncrit = nn.MSELoss(**opts)\n"
            "v = crit(a, b).data[0]\n",
            id="unreduced-through-kwargs",
        ),
        pytest.param(
            "import torch.nn.functional as F\nloss = F.mse_loss(a, b)\nloss.data[0] = 1\n",
            id="assignment-target",
        ),
        pytest.param(
            "import torch\nloss.backward(torch.ones(3))\nv = loss.data[0]\n",
            id="backward-with-gradient",
        ),
    ],
)
def test_zero_dim_index_noop(source):
    assert found(source, "ACC503") == []


# -- ACC504 eval-without-no-grad ------------------------------------------------------------
EVAL_LOADER = (
    "import torch\nfrom torch.utils.data import DataLoader\ntest_loader = DataLoader(ds)\n"
    "model = torch.nn.Linear(4, 2)\n"
)


@pytest.mark.parametrize(
    "decorator",
    ["@torch.no_grad()", "@torch.no_grad", "@torch.inference_mode()", "@torch.autograd.no_grad()"],
)
def test_eval_decorated_function_is_not_reported(decorator):
    source = (
        EVAL_LOADER + f"{decorator}\ndef test():\n    for x, y in test_loader:\n        model(x)\n"
    )
    assert found(source, "ACC504") == []


def test_eval_reported_when_grad_is_turned_back_on():
    source = (
        EVAL_LOADER
        + "def test():\n    with torch.inference_mode(False):\n"
        + "        for x, y in test_loader:\n            model(x)\n"
    )
    assert found(source, "ACC504") == ["ACC504"]


def test_eval_method_called_under_no_grad_is_not_reported():
    source = """\
        import torch
        from torch.utils.data import DataLoader
        class Runner:
            def __init__(self):
                self.loader = DataLoader(ds)
                self.model = torch.nn.Linear(4, 2)
            def evaluate(self):
                for x, y in self.loader:
                    self.model(x)
            def run(self):
                with torch.no_grad():
                    self.evaluate()
        """
    assert found(source, "ACC504") == []


def test_eval_wrap_keeps_comments_and_runs():
    source = """\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(4, 2)
        test_loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
        outputs = []


        def test():
            model.eval()
            # one pass
            for (x,) in test_loader:
                # forward only
                outputs.append(model(x))  # keep it
        """
    after = fixed(source, "ACC504")
    assert after.endswith(
        "    # one pass\n"
        "    with torch.no_grad():\n"
        "        for (x,) in test_loader:\n"
        "            # forward only\n"
        "            outputs.append(model(x))  # keep it\n"
    )
    result = run(after)
    result["test"]()
    assert len(result["outputs"]) == 2
    assert not any(out.requires_grad for out in result["outputs"])


def test_eval_training_loop_is_not_reported():
    source = EVAL_LOADER + (
        "def test():\n    model.eval()\n    for x, y in test_loader:\n"
        "        loss = model(x).sum()\n        opt.step(lambda: loss)\n"
    )
    assert found(source, "ACC504") == []


# -- ACC505 adam-weight-decay ------------------------------------------------------------------
def test_adam_import_alias_becomes_adamw():
    source = "import torch\nfrom torch.optim import Adam as A\nopt = A(params, weight_decay=1e-4)\n"
    after = fixed(source, "ACC505")
    assert after == (
        "import torch\nfrom torch.optim import AdamW\nopt = AdamW(params, weight_decay=1e-4)\n"
    )


def test_adam_two_calls_import_adamw_once_and_drop_adam():
    source = """\
        import torch
        from torch.optim import Adam

        model = torch.nn.Linear(2, 2)
        a = Adam(model.parameters(), weight_decay=1e-4)
        b = Adam(model.parameters(), lr=1e-2, weight_decay=1e-3)
        """
    after = fixed(source, "ACC505")
    assert "from torch.optim import AdamW\n" in after and "Adam(" not in after
    assert after.count("AdamW(") == 2
    result = run(after)
    assert isinstance(result["b"], torch.optim.AdamW)


def test_adam_fix_needs_no_scope_analysis(monkeypatch):
    # LibCST's ScopeProvider took over half the lint time of an 8,000-line script and grows
    # faster than the file; the module index answers the same questions in its one pass.
    resolved = []
    resolve_many = MetadataWrapper.resolve_many
    monkeypatch.setattr(
        MetadataWrapper, "resolve_many",
        lambda wrapper, providers: resolved.extend(providers) or resolve_many(wrapper, providers),
    )  # fmt: skip
    source = "from torch.optim import Adam\nopt = Adam(params, weight_decay=1e-4)\n"
    assert fixed(source, "ACC505") == (
        "from torch.optim import AdamW\nopt = AdamW(params, weight_decay=1e-4)\n"
    )
    assert ScopeProvider not in resolved


def test_adam_from_internal_module_uses_the_public_path():
    source = "from torch.optim.adam import Adam\nopt = Adam(params, weight_decay=1e-4)\n"
    assert fixed(source, "ACC505") == (
        "import torch\nfrom torch.optim.adam import Adam\n"
        "opt = torch.optim.AdamW(params, weight_decay=1e-4)\n"
    )


def test_adam_fix_is_unsafe():
    source = "import torch\nopt = torch.optim.Adam(p, weight_decay=1e-4)\n"
    safe_only = LintSettings(select=("ACC505",), unsafe_fixes=False)
    assert fix_source(source, safe_only).source == source


# -- the legacy fixture: fixed, it runs on current PyTorch ------------------------------------
@pytest.mark.runs
@pytest.mark.skipif(not FIXTURE.exists(), reason="fixture not written yet")
def test_legacy_fixture_runs_after_the_fixes(tmp_path):
    # (tests/test_fixtures_smoke.py checks that the original crashes with an IndexError)
    result = fix_source(FIXTURE.read_text(encoding="utf-8"), settings())
    assert result.remaining == []
    script = tmp_path / "fixed.py"
    script.write_text(result.source, encoding="utf-8")
    after = run_script(script, ("--epochs", "1"))
    assert after.returncode == 0, after.stderr
    assert "Test set: Average loss" in after.stdout
    assert "volatile was removed" not in after.stderr
