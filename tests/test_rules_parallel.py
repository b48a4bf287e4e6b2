"""Behaviour of the multi-GPU rules: ACC401-ACC404 (DataParallel, DDP)."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source
from autoaccel.lint.fixer import fix_source

FIXTURES = Path(__file__).parent.parent / "fixtures"


def settings(code: str) -> LintSettings:
    return LintSettings(select=(code,), unsafe_fixes=True)


def lines(source: str, code: str) -> list[int]:
    return [d.line for d in lint_source(dedent(source), settings(code)) if d.code == code]


def fixed(source: str, code: str) -> str:
    return fix_source(dedent(source), settings(code)).source


# -- ACC401 data-parallel --------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("import torch\nm = torch.nn.DataParallel(net)\n", id="torch.nn"),
        pytest.param("import torch.nn as nn\nm = nn.DataParallel(net)\n", id="nn-alias"),
        pytest.param("from torch import nn\nm = nn.DataParallel(net)\n", id="from-torch"),
        pytest.param(
            "import torch\nm = torch.nn.parallel.DataParallel(net)\n", id="torch.nn.parallel"
        ),
        pytest.param(
            "from torch.nn.parallel import DataParallel as DP\nm = DP(net)\n", id="as-alias"
        ),
        pytest.param(
            "from torch.nn.parallel.data_parallel import DataParallel\nm = DataParallel(net)\n",
            id="private-module",
        ),
        pytest.param(
            "import torch.nn as nn\n\n\nclass Trainer:\n    def __init__(self, net):\n"
            "        self.net = nn.DataParallel(net, device_ids=[0, 1]).cuda()\n",
            id="in-method",
        ),
    ],
)
def test_acc401_reports_every_spelling(source):
    (line,) = lines(source, "ACC401")
    assert line == len(source.splitlines())  # the line that builds the wrapper


def test_acc401_reports_the_call_not_other_uses():
    source = """\
        import torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = nn.DataParallel(model)
        if isinstance(model, (nn.DataParallel, DDP)):
            model = model.module
        """
    assert lines(source, "ACC401") == [3]


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as D\nm = D(net)\n",
        "import torch\nfrom mylib import DataParallel\nm = DataParallel(net)\n",
    ],
    ids=["ddp", "own-class"],
)
def test_acc401_does_nothing_for_ddp_or_own_class(source):
    assert lines(source, "ACC401") == []


def test_acc401_has_no_fix_and_respects_noqa():
    source = "import torch.nn as nn\nm = nn.DataParallel(net)\n"
    (diagnostic,) = lint_source(source, settings("ACC401"))
    assert diagnostic.fix is None
    assert "convert --to ddp" in diagnostic.message
    assert fixed(source, "ACC401") == source
    assert (
        lines("import torch.nn as nn\nm = nn.DataParallel(net)  # noqa: ACC401\n", "ACC401") == []
    )


# -- ACC402 data-parallel-loss-outside-forward -------------------------------------

_DP_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def test_acc402_fixture_reports_the_training_loss_only():
    source = (FIXTURES / "dataparallel_existing.py").read_text()
    diagnostics = [d for d in lint_source(source, settings("ACC402"))]
    assert [(d.line, d.code) for d in diagnostics] == [(93, "ACC402")]
    assert "convert --to dp" in diagnostics[0].message
    assert diagnostics[0].fix is None


def test_acc402_reports_at_the_loss_call():
    source = _DP_HEADER + dedent("""\
        criterion = nn.CrossEntropyLoss()
        model = nn.DataParallel(Net())
        for x, y in train_loader:
            out = model(x)
            loss = 0.5 * criterion(out, y)
            loss.backward()
        """)
    (diagnostic,) = lint_source(source, settings("ACC402"))
    assert (diagnostic.line, diagnostic.column) == (8, 18)


@pytest.mark.parametrize(
    "wrap",
    [
        "model = nn.DataParallel(model)",
        "model = nn.DataParallel(model).to(device)",
        "model = torch.nn.parallel.DataParallel(model).cuda()",
        "model = nn.DataParallel(model) if torch.cuda.device_count() > 1 else model",
        "net = nn.DataParallel(model)\nmodel = net",
    ],
)
def test_acc402_follows_the_wrapped_name(wrap):
    source = _DP_HEADER + wrap + dedent("""
        for x, y in train_loader:
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, 10), y.view(-1))
            loss.backward()
        """)
    assert len(lines(source, "ACC402")) == 1


def test_acc402_in_a_trainer_class_and_a_train_function():
    source = _DP_HEADER + dedent("""\
        class Trainer:
            def __init__(self, net):
                self.model = nn.DataParallel(net)
                self.criterion = nn.MSELoss()

            def step(self, x, y):
                pred = self.model(x).squeeze(1)
                loss = self.criterion(pred, y)
                loss.backward()


        def train(model, loader):
            for x, y in loader:
                loss = F.nll_loss(model(x), y)
                loss.backward()


        model = nn.DataParallel(Net())
        train(model, train_loader)
        """)
    assert lines(source, "ACC402") == [11, 17]


def test_acc402_does_nothing_when_the_loss_is_computed_inside_forward():
    source = _DP_HEADER + dedent("""\
        class NetWithLoss(nn.Module):
            def __init__(self, net):
                super().__init__()
                self.net = net
                self.criterion = nn.CrossEntropyLoss()

            def forward(self, x, y):
                out = self.net(x)
                return self.criterion(out, y)


        model = nn.DataParallel(NetWithLoss(Net()))
        for x, y in train_loader:
            loss = model(x, y).mean()
            loss.backward()
        """)
    assert lines(source, "ACC402") == []


@pytest.mark.parametrize(
    "body",
    [
        # evaluation under no_grad
        "with torch.no_grad():\n    for x, y in loader:\n        out = model(x)\n"
        "        total += F.cross_entropy(out, y).item()\n",
        # `.module` bypasses the scatter/gather
        "for x, y in loader:\n    out = model.module(x)\n    loss = F.cross_entropy(out, y)\n"
        "    loss.backward()\n",
        # the loss reads another model's output
        "for x, y in loader:\n    out = model(x)\n    ref = teacher(x)\n"
        "    loss = F.mse_loss(ref, y)\n    loss.backward()\n",
        # a function that never trains
        "def evaluate(x, y):\n    out = model(x)\n    return F.cross_entropy(out, y)\n",
    ],
    ids=["no-grad", "module", "other-model", "no-backward"],
)
def test_acc402_does_nothing_outside_training_or_without_gather(body):
    source = _DP_HEADER + "model = nn.DataParallel(Net())\nteacher = Net()\n" + body
    assert lines(source, "ACC402") == []


def test_acc402_does_nothing_without_data_parallel():
    source = _DP_HEADER + dedent("""\
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(Net())
        for x, y in train_loader:
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
        """)
    assert lines(source, "ACC402") == []


def test_acc402_keeps_functions_apart():
    source = _DP_HEADER + dedent("""\
        model = nn.DataParallel(Net())


        def forward_only(x):
            out = model(x)
            return out


        def train_step(out, y):
            loss = F.cross_entropy(out, y)
            loss.backward()
        """)
    assert lines(source, "ACC402") == []


# -- ACC403 unguarded-rank-save ------------------------------------------------------

_DIST = "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("import torch\ntorch.save(model.state_dict(), 'm.pt')\n", id="plain"),
        pytest.param(
            "import torch\nimport torch.nn as nn\nmodel = nn.DataParallel(model)\n"
            "torch.save(model.state_dict(), 'm.pt')\n",
            id="data-parallel",
        ),
        pytest.param(
            "import torch\nimport torch.distributed as dist\nrank = dist.get_rank() if dist.is_initialized() else 0\n"
            "torch.save(model.state_dict(), 'm.pt')\n",
            id="mentions-dist-without-init",
        ),
    ],
)
def test_acc403_does_nothing_in_a_single_process_script(source):
    assert lines(source, "ACC403") == []


@pytest.mark.parametrize(
    "guard",
    [
        "if rank == 0:",
        "if args.local_rank == 0:",
        "if dist.get_rank() == 0:",
        "if torch.distributed.get_rank() == 0:",
        "if not rank:",
        "if args.local_rank in (0, -1):",
        "if is_main_process():",
        "if utils.is_main_process() and epoch % 10 == 0:",
        "if accelerator.is_main_process:",
        "if self.is_master:",
        "if RANK == 0:",
        "if not args.distributed or args.rank % ngpus_per_node == 0:",
    ],
)
def test_acc403_does_nothing_under_a_rank_guard(guard):
    source = _DIST + f"{guard}\n    torch.save(model.state_dict(), 'm.pt')\n"
    assert lines(source, "ACC403") == []


def test_acc403_guards_through_else_elif_and_early_return():
    source = _DIST + dedent("""\
        if rank != 0:
            pass
        elif epoch % 5 == 0:
            torch.save(model.state_dict(), 'a.pt')


        def save(model):
            if dist.get_rank() != 0:
                return
            if best:
                torch.save(model.state_dict(), 'best.pt')


        for epoch in range(3):
            if local_rank > 0:
                continue
            torch.save(model.state_dict(), f'e{epoch}.pt')
        if dist.get_rank() != 0:
            sys.exit(0)
        torch.save(model.state_dict(), 'final.pt')
        """)
    assert lines(source, "ACC403") == []


def test_acc403_an_unrelated_if_does_not_guard():
    source = _DIST + dedent("""\
        for epoch in range(3):
            if epoch % 5 == 0:
                torch.save(model.state_dict(), 'a.pt')
            if acc > best:
                torch.save(model.state_dict(), 'best.pt')
        """)
    assert lines(source, "ACC403") == [6, 8]


def test_acc403_functions_called_only_under_guards():
    source = _DIST + dedent("""\
        def save_checkpoint(state, path):
            torch.save(state, path)


        def maybe_save(state):
            save_checkpoint(state, 'last.pt')


        def write_all(state):
            torch.save(state, 'all.pt')


        class Trainer:
            def checkpoint(self):
                torch.save(self.model.state_dict(), 'trainer.pt')

            def fit(self):
                if self.rank == 0:
                    self.checkpoint()


        if rank == 0:
            save_checkpoint(state, 'a.pt')
            maybe_save(state)
        write_all(state)
        if rank == 0:
            write_all(state)
        """)
    # save_checkpoint: every call guarded, directly or through maybe_save;
    # Trainer.checkpoint: its one call is guarded; write_all: one call is not.
    assert lines(source, "ACC403") == [13]


def test_acc403_reports_a_worker_started_by_spawn():
    source = dedent("""\
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp


        def main_worker(gpu, args):
            dist.init_process_group('nccl', rank=gpu, world_size=args.world_size)
            for epoch in range(args.epochs):
                train(epoch)
                torch.save(model.state_dict(), 'checkpoint.pt')


        if __name__ == '__main__':
            mp.spawn(main_worker, nprocs=4, args=(args,))
        """)
    assert lines(source, "ACC403") == [10]


def test_acc403_does_nothing_for_per_rank_files():
    source = _DIST + dedent("""\
        torch.save(optimizer.state_dict(), f'optim_rank{dist.get_rank()}.pt')
        torch.save(shard, os.path.join(out, 'shard_%d.pt' % args.local_rank))
        """)
    assert lines(source, "ACC403") == []


@pytest.mark.parametrize(
    "distributed",
    [
        "from torch.distributed import init_process_group\ninit_process_group('nccl')\n",
        "from torch.nn.parallel import DistributedDataParallel\nmodel = DistributedDataParallel(model)\n",
        "import torch.nn.parallel\nmodel = torch.nn.parallel.DistributedDataParallel(model)\n",
    ],
)
def test_acc403_knows_a_distributed_script(distributed):
    source = "import torch\n" + distributed + "torch.save(model.state_dict(), 'm.pt')\n"
    assert len(lines(source, "ACC403")) == 1


def test_acc403_fix_uses_the_scripts_spelling_and_keeps_comments():
    source = _DIST + dedent("""\
        for epoch in range(3):
            train()
            # keep the last epoch
            torch.save(model.state_dict(), 'm.pt')  # every epoch
            print('saved')
        """)
    assert fixed(source, "ACC403") == _DIST + dedent("""\
        for epoch in range(3):
            train()
            # keep the last epoch
            if not dist.is_initialized() or dist.get_rank() == 0:
                torch.save(model.state_dict(), 'm.pt')  # every epoch
            print('saved')
        """)


def test_acc403_fix_spells_torch_distributed_and_imports_torch():
    source = dedent("""\
        from torch import save
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        save(model.state_dict(), "m.pt")
        """)
    result = fixed(source, "ACC403")
    assert result == dedent("""\
        import torch
        from torch import save
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            save(model.state_dict(), "m.pt")
        """)
    assert lines(result, "ACC403") == []


def test_acc403_fix_is_unsafe_and_missing_where_it_cannot_help():
    source = _DIST + dedent("""\
        with open(path, 'wb') as f:
            torch.save(model, f)
        torch.save(a, 'a.pt'); print('saved')
        """)
    diagnostics = lint_source(source, settings("ACC403"))
    assert [d.line for d in diagnostics] == [5, 6]
    assert all(d.fix is None for d in diagnostics)
    simple = _DIST + "torch.save(a, 'a.pt')\n"
    (diagnostic,) = lint_source(simple, settings("ACC403"))
    assert diagnostic.fix_applicability.value == "unsafe"
    assert fix_source(simple, LintSettings(select=("ACC403",))).source == simple


# -- ACC404 ddp-accumulation-without-no-sync -------------------------------------------

_DDP = dedent("""\
    import contextlib

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(Net().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters())
    """)


def test_acc404_reports_the_backward_call():
    source = _DDP + dedent("""\
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / accum_steps
            loss.backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        """)
    (diagnostic,) = lint_source(source, settings("ACC404"))
    assert (diagnostic.line, diagnostic.column) == (10, 5)
    assert diagnostic.fix is None
    assert "no_sync" in diagnostic.message


def test_acc404_in_a_train_function_with_a_helper_made_optimizer():
    source = _DDP + dedent("""\
        def train(model, loader, optim, scaler):
            for step, batch in enumerate(loader):
                with torch.autocast("cuda"):
                    loss = model(**batch).loss / args.gradient_accumulation_steps
                scaler.scale(loss).backward()
                if step % args.gradient_accumulation_steps == 0:
                    scaler.step(optim)
                    scaler.update()
                    optim.zero_grad()


        train(model, train_loader, build_optimizer(model), scaler)
        """)
    assert lines(source, "ACC404") == [12]


def test_acc404_micro_batches_in_an_inner_loop():
    source = _DDP + dedent("""\
        for x, y in loader:
            for mx, my in zip(x.chunk(4), y.chunk(4)):
                model(mx, my).backward()
            optimizer.step()
        """)
    assert lines(source, "ACC404") == [10]


@pytest.mark.parametrize(
    "loop",
    [
        pytest.param(
            "for i, (x, y) in enumerate(loader):\n"
            "    updating = (i + 1) % accum_steps == 0\n"
            "    with contextlib.nullcontext() if updating else model.no_sync():\n"
            "        criterion(model(x), y).backward()\n"
            "    if (i + 1) % accum_steps == 0:\n        optimizer.step()\n",
            id="no_sync",
        ),
        pytest.param(
            "for i, (x, y) in enumerate(loader):\n"
            "    model.require_backward_grad_sync = (i + 1) % accum_steps == 0\n"
            "    criterion(model(x), y).backward()\n"
            "    if (i + 1) % accum_steps == 0:\n        optimizer.step()\n",
            id="sync-flag",
        ),
        pytest.param(
            "for i, (x, y) in enumerate(loader):\n    criterion(model(x), y).backward()\n"
            "    optimizer.step()\n    if i % 100 == 0:\n        scheduler.step()\n",
            id="step-every-iteration",
        ),
        pytest.param(
            "for x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n"
            "    if torch.isfinite(loss):\n        optimizer.step()\n",
            id="skip-non-finite",
        ),
        pytest.param(
            "for i, (x, y) in enumerate(loader):\n    if i % 2 == 0:\n"
            "        criterion(model(x), y).backward()\n        optimizer.step()\n",
            id="conditional-backward",
        ),
        pytest.param(
            "for i, (x, y) in enumerate(loader):\n    criterion(model(x), y).backward()\n"
            "    if (i + 1) % accum_steps == 0:\n        optimizer.step()\n"
            "    optimizer.step()\n",
            id="also-unconditional-step",
        ),
        pytest.param(
            "for i, (x, y) in enumerate(loader):\n    criterion(model(x), y).backward()\n"
            "    self.optimizer_step()\n",
            id="step-in-a-helper",
        ),
    ],
)
def test_acc404_does_nothing_without_wasted_all_reduce(loop):
    assert lines(_DDP + loop, "ACC404") == []


def test_acc404_does_nothing_without_ddp():
    source = dedent("""\
        import torch
        import torch.nn as nn

        model = nn.DataParallel(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, (x, y) in enumerate(loader):
            criterion(model(x), y).backward()
            if (i + 1) % accum_steps == 0:
                optimizer.step()
        """)
    assert lines(source, "ACC404") == []
    transformer = (FIXTURES / "transformer_accum.py").read_text()
    assert lines(transformer, "ACC404") == []
    ddp = transformer.replace(
        "model = TransformerClassifier(vocab_size, n_classes).to(device)",
        "model = torch.nn.parallel.DistributedDataParallel("
        "TransformerClassifier(vocab_size, n_classes).to(device))",
    )
    assert lines(ddp, "ACC404") == [107]  # loss.backward()
