"""Behaviour of the data and cuDNN rules: ACC102, ACC103, ACC104, ACC105, ACC201, ACC202."""

from __future__ import annotations

import textwrap

import pytest

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source


def settings(code: str, unsafe: bool = True) -> LintSettings:
    return LintSettings(select=(code,), unsafe_fixes=unsafe)


def lines(source: str, code: str) -> list[int]:
    return [d.line for d in lint_source(textwrap.dedent(source), settings(code)) if d.code == code]


def fixed(source: str, code: str, unsafe: bool = True) -> str:
    return fix_source(textwrap.dedent(source), settings(code, unsafe)).source


# -- ACC102 dataloader-without-pin-memory ---------------------------------------------


def test_acc102_fix_imports_torch_where_the_module_imports_only_the_loader():
    """A data module of a project (`from torch.utils.data import DataLoader` only): the
    fixed loader's `torch.cuda.is_available()` needs `import torch` (it raised NameError
    when the converted project started)."""
    source = """\
        from torch.utils.data import DataLoader

        def loaders(ds):
            return DataLoader(ds, batch_size=4)

        model.cuda()
        for x in loaders(data):
            model(x).sum().backward()
        """
    result = fixed(source, "ACC102")
    assert result.startswith("import torch\nfrom torch.utils.data import DataLoader\n")
    assert "pin_memory=torch.cuda.is_available()" in result
    compile(result, "data.py", "exec")


# -- ACC103 blocking-device-copy ----------------------------------------------------

TRAINER = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

class Trainer:
    def __init__(self):
        self.device = torch.device("cuda")
        self.model = nn.Linear(2, 2).to(self.device)
        self.loader = DataLoader(ds, pin_memory=True)

    def fit(self):
        for batch in self.loader:
            inputs, labels = batch
            inputs = inputs.to(self.device)
            labels = batch[1].to(self.device)
            out = self.model(inputs)
            out = out.to(self.device)
            loss = criterion(out, labels)
            loss.backward()
"""


def test_acc103_follows_names_assigned_from_the_batch_in_a_method():
    assert lines(TRAINER, "ACC103") == [14, 15]


def test_acc103_fix_adds_non_blocking_only_to_batch_copies():
    result = fixed(TRAINER, "ACC103")
    assert "inputs = inputs.to(self.device, non_blocking=True)" in result
    assert "labels = batch[1].to(self.device, non_blocking=True)" in result
    assert "out = out.to(self.device)\n" in result  # a model output, not a batch
    assert "nn.Linear(2, 2).to(self.device)\n" in result  # the model


def test_acc103_fix_is_unsafe():
    assert fixed(TRAINER, "ACC103", unsafe=False) == TRAINER


@pytest.mark.parametrize(
    "copy",
    [
        pytest.param("x = x.to(device)", id="device-variable"),
        pytest.param("x = x.to('cuda')", id="string"),
        pytest.param("x = x.to(torch.device('cuda', 0))", id="device-call"),
        pytest.param("x = x.to(device=device, dtype=torch.half)", id="keywords"),
        pytest.param("x = x.float().cuda()", id="method-chain"),
    ],
)
def test_acc103_reports(copy):
    source = f"""\
    import torch
    from torch.utils.data import DataLoader
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(ds)
    for step, (x, y) in enumerate(loader):
        {copy}
        model(x).sum().backward()
    """
    assert lines(source, "ACC103") == [6]


@pytest.mark.parametrize(
    "copy",
    [
        pytest.param("x = x.to(device, non_blocking=True)", id="already"),
        pytest.param("x = x.cuda(0, True)", id="positional-non-blocking"),
        pytest.param("x = x.to(torch.bfloat16)", id="dtype-only"),
        pytest.param("x = x.to('cpu')", id="to-cpu"),
        pytest.param("x = x.to(torch.device('cpu'))", id="to-cpu-device"),
        pytest.param("x = x.to(host)", id="to-cpu-variable"),
        pytest.param("model.to(device)", id="model"),
        pytest.param("w = weights.to(device)", id="not-a-batch"),
        pytest.param("x = x.to(*where)", id="star-args"),
        pytest.param("x = x.to(device)  # noqa: ACC103", id="noqa"),
    ],
)
def test_acc103_does_nothing(copy):
    source = f"""\
    import torch
    from torch.utils.data import DataLoader
    device = torch.device("cuda")
    host = torch.device("cpu")
    loader = DataLoader(ds)
    for x, y in loader:
        {copy}
        model(x).sum().backward()
    """
    assert lines(source, "ACC103") == []


def test_acc103_eval_loop_over_a_pinned_loader_is_reported_too():
    source = """\
    import torch
    from torch.utils.data import DataLoader
    loader = DataLoader(ds, pin_memory=True)
    with torch.no_grad():
        for x, y in loader:
            pred = model(x.cuda())
    """
    assert fixed(source, "ACC103").endswith("pred = model(x.cuda(non_blocking=True))\n")


def test_acc103_does_nothing_outside_a_step_loop():
    source = """\
    import torch
    x = torch.randn(3)
    for i in range(3):
        y = x.cuda()
    """
    assert lines(source, "ACC103") == []


# -- ACC104 shuffle-with-sampler ----------------------------------------------------


@pytest.mark.parametrize(
    ("imports", "loader"),
    [
        ("import torch", "torch.utils.data.DataLoader"),
        ("import torch.utils.data as tud", "tud.DataLoader"),
        ("from torch.utils.data import DataLoader as DL", "DL"),
        ("from torch.utils.data.dataloader import DataLoader", "DataLoader"),
    ],
)
def test_acc104_every_import_spelling(imports, loader):
    source = f"{imports}\nloader = {loader}(ds, shuffle=True, sampler=Sampler(ds))\n"
    assert fixed(source, "ACC104", unsafe=False) == (
        f"{imports}\nloader = {loader}(ds, sampler=Sampler(ds))\n"
    )


def test_acc104_keeps_one_argument_per_line_layout():
    source = """\
    from torch.utils.data import DataLoader
    loader = DataLoader(
        train_set,
        batch_size=64,
        shuffle=True,  # mix it up
        sampler=sampler,
    )
    sampler = make_sampler()
    """
    assert fixed(source, "ACC104") == textwrap.dedent("""\
        from torch.utils.data import DataLoader
        loader = DataLoader(
            train_set,
            batch_size=64,
            sampler=sampler,
        )
        sampler = make_sampler()
        """)


def test_acc104_sampler_parameter_may_be_none():
    source = """\
    from torch.utils.data import DataLoader
    def make_loader(ds, sampler=None):
        return DataLoader(ds, shuffle=True, sampler=sampler)
    """
    assert "DataLoader(ds, shuffle=sampler is None, sampler=sampler)" in fixed(source, "ACC104")


def test_acc104_self_attribute_sampler():
    source = """\
    from torch.utils.data import DataLoader, DistributedSampler
    class Data:
        def setup(self, ds):
            self.sampler = DistributedSampler(ds)
            self.loader = DataLoader(ds, shuffle=True, sampler=self.sampler)
    """
    assert "DataLoader(ds, sampler=self.sampler)" in fixed(source, "ACC104")


@pytest.mark.parametrize(
    "call",
    [
        pytest.param("DataLoader(ds, 64, True, DistributedSampler(ds))", id="positional"),
        pytest.param("DataLoader(ds, sampler=DistributedSampler(ds), **kw)", id="kwargs-dict"),
    ],
)
def test_acc104_reports_without_fix_when_shuffle_is_not_written_as_keyword(call):
    source = (
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        f"kw = dict(shuffle=True)\nloader = {call}\n"
    )
    (diagnostic,) = lint_source(source, settings("ACC104"))
    assert diagnostic.fix_title is None


def test_acc104_does_nothing_when_shuffle_may_be_false():
    source = (
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(ds, shuffle=(sampler is None), sampler=sampler)\n"
        "loader = DataLoader(ds, shuffle=False, batch_sampler=batches)\n"
    )
    assert lines(source, "ACC104") == []


# -- ACC105 sampler-epoch-not-set ---------------------------------------------------


@pytest.mark.parametrize(
    ("imports", "sampler"),
    [
        ("import torch", "torch.utils.data.distributed.DistributedSampler"),
        ("import torch", "torch.utils.data.DistributedSampler"),
        ("import torch.utils.data as tud", "tud.distributed.DistributedSampler"),
        ("from torch.utils.data.distributed import DistributedSampler as DS", "DS"),
    ],
)
def test_acc105_every_import_spelling(imports, sampler):
    source = (
        f"import torch\n{imports}\ntrain_sampler = {sampler}(ds, num_replicas=2, rank=0)\n"
        "loader = torch.utils.data.DataLoader(ds, sampler=train_sampler)\n"
    )
    train = "for x in loader:\n    model(x).backward()\n"
    assert lines(source + train, "ACC105") == [3]
    assert lines(source + "train_sampler.set_epoch(1)\n" + train, "ACC105") == []


def test_acc105_loader_trained_by_another_module_is_not_reported():
    source = """\
    from torch.utils.data import DataLoader, DistributedSampler
    def loaders(ds):
        sampler = DistributedSampler(ds)
        train_loader = DataLoader(ds, sampler=sampler)
        return train_loader
    """
    assert lines(source, "ACC105") == []


def test_acc105_set_epoch_in_another_method():
    source = """\
    import torch
    from torch.utils.data import DataLoader, DistributedSampler
    class Trainer:
        def __init__(self, ds):
            self.sampler = DistributedSampler(ds)
            self.loader = DataLoader(ds, sampler=self.sampler)
        def epoch(self, n):
            self.sampler.set_epoch(n)
            for x in self.loader:
                model(x).backward()
    """
    assert lines(source, "ACC105") == []
    assert lines(source.replace("self.sampler.set_epoch", "print"), "ACC105") == [5]


def test_acc105_inline_sampler_set_through_the_loader():
    source = """\
    from torch.utils.data import DataLoader, DistributedSampler
    class Trainer:
        def __init__(self, ds):
            self.loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))
        def epoch(self, n):
            self.loader.sampler.set_epoch(n)
            for x in self.loader:
                model(x).backward()
    """
    assert lines(source, "ACC105") == []
    assert lines(source.replace("self.loader.sampler.set_epoch", "print"), "ACC105") == [4]


def test_acc105_conditional_sampler_is_reported_without_fix():
    source = """\
    from torch.utils.data import DataLoader, DistributedSampler
    sampler = DistributedSampler(ds) if distributed else None
    loader = DataLoader(ds, sampler=sampler)
    for x in loader:
        model(x).backward()
    """
    (diagnostic,) = lint_source(textwrap.dedent(source), settings("ACC105"))
    assert (diagnostic.line, diagnostic.fix_title) == (2, None)


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param("sampler = DistributedSampler(ds, 2, 0, False)\n", id="positional-no-shuffle"),
        pytest.param("sampler = DistributedSampler(ds, shuffle=False)\n", id="no-shuffle"),
        pytest.param("sampler = DistributedSampler(ds)\nget_sampler().set_epoch(1)\n", id="opaque"),
        pytest.param("sampler = DistributedSampler(ds)\nalias.set_epoch(1)\n", id="alias"),
        pytest.param("samplers[0] = DistributedSampler(ds)\n", id="not-a-name"),
        pytest.param("sampler = DistributedSampler(ds)  # noqa: ACC105\n", id="noqa"),
    ],
)
def test_acc105_does_nothing(extra):
    source = "from torch.utils.data import DistributedSampler\n" + extra
    assert lines(source, "ACC105") == []


# -- ACC201 cudnn-benchmark-disabled ------------------------------------------------

CNN = """\
\"\"\"Train a CNN.\"\"\"
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F  # functional API

# ---- model ----
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3)
        self.head = torch.nn.Conv2d(8, 1, 1)


def train(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        F.cross_entropy(model(x.cuda()), y.cuda()).backward()
"""


def test_acc201_reports_the_first_convolution():
    assert lines(CNN, "ACC201") == [13]


def test_acc201_fix_goes_after_the_import_block_and_keeps_comments():
    assert fixed(CNN, "ACC201") == CNN.replace(
        "# functional API\n\n", "# functional API\n\ntorch.backends.cudnn.benchmark = True\n\n"
    )


def test_acc201_fix_is_unsafe():
    assert fixed(CNN, "ACC201", unsafe=False) == CNN


@pytest.mark.parametrize(
    "setting",
    [
        "import torch.backends.cudnn as cudnn\ncudnn.benchmark = True\n",
        "from torch.backends import cudnn\ncudnn.benchmark = True\n",
        "import torch.backends.cudnn\ntorch.backends.cudnn.benchmark = True\n",
        "from torch.backends import cudnn as c\nc.deterministic = True\n",
        "torch.backends.cudnn.benchmark = False\n",
        "torch.backends.cudnn.enabled = False\n",
        "torch.use_deterministic_algorithms(True)\n",
    ],
)
def test_acc201_does_nothing_when_the_script_chose(setting):
    assert lines(CNN + setting, "ACC201") == []


def test_acc201_functional_convolution_counts():
    source = """\
    import torch
    import torch.nn.functional as F
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in loader:
        F.conv1d(x.cuda(), model.weight).sum().backward()
    """
    assert lines(source, "ACC201") == [5]


def test_acc201_without_a_leading_import_block_reports_without_fix():
    source = (
        "x = 1\nimport torch\nm = torch.nn.Conv2d(1, 1, 1).cuda()\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\nm(x).backward()\n"
    )
    (diagnostic,) = lint_source(source, settings("ACC201"))
    assert diagnostic.fix_title is None


def test_acc201_does_nothing_without_training():
    source = "import torch\nm = torch.nn.Conv2d(1, 1, 1).cuda()\nprint(m(x))\n"
    assert lines(source, "ACC201") == []


def test_acc201_does_nothing_for_guidance_gradients_in_a_pipeline():
    # Gradients of the image (a blur, a convolution, a backward) but no model trains.
    source = """\
    import torch
    blur = torch.nn.Conv2d(3, 3, 5, groups=3).cuda()
    for t in timesteps:
        image = image.detach().requires_grad_()
        loss = (blur(image) - target).pow(2).sum()
        loss.backward()
        image = image - image.grad
    """
    assert lines(source, "ACC201") == []


# -- ACC202 cudnn-deterministic-with-benchmark --------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.backends.cudnn.deterministic = True\n"
        "torch.backends.cudnn.benchmark = True\n",
        "import torch.backends.cudnn as cudnn\ncudnn.deterministic = True\n"
        "cudnn.benchmark = True\n",
        "import torch\nfrom torch.backends import cudnn\n"
        "torch.use_deterministic_algorithms(True)\ncudnn.benchmark = True\n",
    ],
)
def test_acc202_reports_the_benchmark_assignment(source):
    assert lines(source, "ACC202") == [source.count("\n")]


def test_acc202_has_no_fix():
    source = (
        "import torch\ntorch.backends.cudnn.deterministic = True\n"
        "torch.backends.cudnn.benchmark = True\n"
    )
    result = fix_source(source, settings("ACC202"))
    assert result.source == source
    assert [d.fix_title for d in result.remaining] == [None]


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(
            """\
            import torch
            if args.mode == "repro":
                torch.backends.cudnn.deterministic = True
            elif args.mode == "fast":
                torch.backends.cudnn.benchmark = True
            """,
            id="elif-arms",
        ),
        pytest.param(
            """\
            import torch
            torch.use_deterministic_algorithms(False)
            torch.backends.cudnn.benchmark = True
            """,
            id="deterministic-off",
        ),
        pytest.param(
            """\
            import torch
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = True  # noqa: ACC202
            """,
            id="noqa",
        ),
    ],
)
def test_acc202_does_nothing(source):
    assert lines(source, "ACC202") == []


def test_acc202_same_function_under_a_condition_is_reported():
    source = """\
    import torch
    def setup(seed):
        if seed is not None:
            torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = True
    """
    assert lines(source, "ACC202") == [5]


def test_acc103_device_defined_after_use_and_through_or():
    source = """\
    import torch
    class Trainer:
        def fit(self, loader):
            for x, y in loader:
                x = x.to(self.device)
                model(x).sum().backward()
        def __init__(self, device=None):
            self.device = device or torch.device("cuda")
    loader = torch.utils.data.DataLoader(ds)
    Trainer().fit(loader)
    """
    assert lines(source, "ACC103") == [5]
    assert lines(source.replace('torch.device("cuda")', 'pick("cuda")'), "ACC103") == []
