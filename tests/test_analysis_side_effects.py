"""The side-effect analysis: prints, checkpoint saves and file writes, where they sit and
whether a rank test already limits them to one process."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from autoaccel.analysis.side_effects import EffectKind, SideEffects, find_side_effects


def analyse(source: str) -> SideEffects:
    return find_side_effects(cst.parse_module(textwrap.dedent(source)))


def code(node: cst.CSTNode | None) -> str:
    return cst.Module([]).code_for_node(node).strip() if node is not None else ""


@pytest.mark.parametrize(
    "source, kind",
    [
        pytest.param("print('epoch', 1)\n", EffectKind.PRINT, id="print"),
        pytest.param(
            "import torch\ntorch.save(model.state_dict(), 'm.pt')\n",
            EffectKind.CHECKPOINT,
            id="torch-save",
        ),
        pytest.param(
            "from torch import save as keep\nkeep(model, 'm.pt')\n",
            EffectKind.CHECKPOINT,
            id="aliased-save",
        ),
        pytest.param(
            "import os\nos.makedirs('out', exist_ok=True)\n", EffectKind.DIRECTORY, id="makedirs"
        ),
        pytest.param("import json\njson.dump(history, f)\n", EffectKind.FILE_WRITE, id="json-dump"),
        pytest.param(
            "import matplotlib.pyplot as plt\nplt.savefig('loss.png')\n",
            EffectKind.FILE_WRITE,
            id="savefig",
        ),
        pytest.param("path.write_text(report)\n", EffectKind.FILE_WRITE, id="write-text-method"),
        # pytorch/examples' dcgan wrote its sample images on every rank.
        pytest.param(
            "import torchvision.utils as vutils\nvutils.save_image(fake, 'f.png')\n",
            EffectKind.FILE_WRITE,
            id="save-image",
        ),
        pytest.param("model.save_pretrained('out')\n", EffectKind.FILE_WRITE, id="save-pretrained"),
        # A writing method on a local object (the figure is bound in this module).
        pytest.param(
            "import matplotlib.pyplot as plt\nfig = plt.gcf()\nfig.savefig('loss.png')\n",
            EffectKind.FILE_WRITE,
            id="savefig-method-of-local",
        ),
        pytest.param(
            "with open('log.txt', 'a') as f:\n    f.write('x')\n",
            EffectKind.FILE_WRITE,
            id="open-append",
        ),
        pytest.param(
            "with open(path, mode=m) as f:\n    pass\n",
            EffectKind.FILE_WRITE,
            id="open-unknown-mode",
        ),
    ],
)
def test_finds_effect(source, kind):
    effects = analyse(source).effects
    assert [e.kind for e in effects] == [kind]
    assert effects[0].statement is not None
    assert not effects[0].guarded


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("with open('data.txt') as f:\n    text = f.read()\n", id="open-for-reading"),
        pytest.param("with open('data.txt', 'rb') as f:\n    pass\n", id="open-rb"),
        pytest.param("import torch\nstate = torch.load('m.pt')\n", id="load"),
        pytest.param("from mylib import save\nsave(model, 'm.pt')\n", id="users-own-save"),
        pytest.param("logger.info('epoch done')\n", id="logging-call"),
    ],
)
def test_ignores_non_writes(source):
    assert analyse(source).effects == []


def test_the_with_statement_is_what_to_guard_for_an_opened_file():
    (effect,) = analyse("""\
        import torch
        with open(args.save, 'wb') as f:
            torch.save(model.state_dict(), f)
        """).effects[:1]
    assert effect.kind is EffectKind.FILE_WRITE
    assert code(effect.statement).startswith("with open(args.save, 'wb') as f:")


def test_a_call_inside_an_expression_has_no_statement_to_guard():
    (effect,) = analyse("ok = print('x') or True\n").effects
    assert effect.statement is None


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("if RANK == 0:\n    print('x')\n", id="if-rank"),
        pytest.param("if dist.get_rank() == 0:\n    print('x')\n", id="get-rank"),
        pytest.param("if args.local_rank in (-1, 0):\n    print('x')\n", id="local-rank"),
        pytest.param("if is_main_process():\n    print('x')\n", id="main-process"),
        pytest.param(
            "def log(x):\n    if rank != 0:\n        return\n    print(x)\n", id="early-return"
        ),
    ],
)
def test_already_guarded(source):
    (effect,) = analyse(source).effects
    assert effect.guarded


def test_a_rank_test_outside_the_function_does_not_guard_it():
    (effect,) = analyse("if rank == 0:\n    def log(x):\n        print(x)\n").effects
    assert not effect.guarded


def test_writer_function_does_nothing_but_write():
    found = analyse("""\
        import os, torch
        def save_checkpoint(self, epoch, is_best=False):
            '''Save the state.'''
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            state = {"epoch": epoch, "model": self.model.state_dict()}
            path = os.path.join(self.checkpoint_dir, "last.pt")
            torch.save(state, path)
            if is_best:
                torch.save(state, "best.pt")
        """)
    assert [f.name.value for f in found.writer_functions] == ["save_checkpoint"]
    assert {e.function.name.value for e in found.effects} == {"save_checkpoint"}


def test_a_writer_may_delete_its_own_locals():
    """SupContrast's `save_model()` ends with `del state`: still nothing but a write."""
    source = "import torch\ndef save(model, path):\n    state = model.state_dict()\n    torch.save(state, path)\n    del state{}\n"
    assert len(analyse(source.format("")).writer_functions) == 1
    assert len(analyse(source.format(", path")).writer_functions) == 1
    assert analyse(source.format(", model.weight")).writer_functions == set()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param("    model.train()\n    print('x')\n", id="trains"),
        pytest.param("    self.best = 1\n    print('x')\n", id="sets-an-attribute"),
        pytest.param("    print('x')\n    return 1\n", id="returns-a-value"),
        pytest.param("    for x in xs:\n        print(x)\n", id="loops"),
    ],
)
def test_function_that_also_does_other_work_is_no_writer(body):
    assert analyse("def f(self):\n" + body).writer_functions == set()
