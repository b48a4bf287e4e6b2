"""Linting never needs torch: it works where torch cannot be imported, and the lint
machinery does not import it (start-up stays light for pre-commit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import SCRIPT

# A sitecustomize that makes `import torch` fail the way it does where torch is absent.
BLOCK_TORCH = textwrap.dedent("""\
    import sys


    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, _NoTorch())
    """)


def without_torch(tmp_path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_TORCH)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path[1:]])}


def test_blocker_really_blocks_torch(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", "import torch"],
        env=without_torch(tmp_path),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert "No module named 'torch'" in run.stderr


def test_lint_and_fix_work_without_torch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = without_torch(tmp_path)
    lint = [sys.executable, "-m", "autoaccel", "lint", "--select", "ACC101,ACC102"]
    run = subprocess.run([*lint, str(script)], env=env, capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    assert f"{script}:4:10: ACC101" in run.stdout
    assert f"{script}:4:10: ACC102" in run.stdout
    fixed = subprocess.run(
        [*lint, "--fix", "--unsafe-fixes", str(script)], env=env, capture_output=True, text=True
    )
    assert fixed.returncode == 0, fixed.stderr
    assert "pin_memory=torch.cuda.is_available()" in script.read_text()


def test_lint_machinery_does_not_import_torch():
    code = textwrap.dedent("""\
        import sys
        import autoaccel.cli, autoaccel.lint.engine, autoaccel.lint.fixer, autoaccel.lint.output
        from autoaccel.config import LintSettings
        from autoaccel.lint.engine import lint_source
        found = lint_source(%r, LintSettings())
        assert found, "expected findings"
        print("torch" in sys.modules)
        """) % SCRIPT
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "False\n"


# What a pre-commit run must not pay for: torch, typer and pydantic (typer's parameter
# coercion, ~0.07 s; the hooks' plain calls skip typer), LibCST's matchers and codemods
# (convert only), black and rich (convert and tune), the process pool (4 files or more).
HEAVY = ("torch", "typer", "pydantic", "libcst.matchers", "libcst.codemod", "black", "rich",
         "concurrent.futures.process")  # fmt: skip
# What only fixes need: the fixer, and the temporary file of an atomic write.
FIXING = ("autoaccel.lint.fixer", "tempfile")


@pytest.mark.parametrize(
    ("flags", "unused"),
    [(["--force-exclude"], HEAVY + FIXING + ("autoaccel.convert",)), (["--fix"], HEAVY)],
    ids=["lint", "lint --fix"],
)
def test_a_hook_run_imports_nothing_it_does_not_use(tmp_path, flags, unused):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code = textwrap.dedent(f"""\
        import sys
        from autoaccel.__main__ import main
        sys.argv = ["autoaccel", "lint", *{flags!r}, {str(script)!r}]
        try:
            main()
        finally:
            print([name for name in {unused!r} if name in sys.modules], file=sys.stderr)
        """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[-1] == "[]"
