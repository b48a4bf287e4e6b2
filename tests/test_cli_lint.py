"""`autoaccel lint` end to end: report, exit codes, fixes, stdin, rules, version."""

from __future__ import annotations

import gc
import inspect
import io
import os
import re
import stat
import subprocess
import sys

import pytest
from conftest import CLEAN, SCRIPT, SELECT
from typer.testing import CliRunner

from autoaccel import __version__, cli
from autoaccel.config import LintSettings
from autoaccel.diff import use_colour
from autoaccel.lint import runner
from autoaccel.lint.command import PLAIN_FLAGS, run_lint, run_plain_call
from autoaccel.lint.fixer import fix_source
from autoaccel.lint.runner import Mode, Overrides, lint_files
from autoaccel.rules import all_rules

ACC101 = "ACC101 `DataLoader` loads batches in the main process (`num_workers=0`)"
ACC102 = "ACC102 [*] `DataLoader` feeding CUDA does not pin memory (`pin_memory=False`)"


def test_text_format_lines_and_summary_on_stderr(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "train.py")
    assert run.exit_code == 1
    assert run.stdout == f"train.py:4:10: {ACC101}\ntrain.py:4:10: {ACC102}\n"
    assert "Found 2 errors." in run.stderr
    assert "[*] 1 fixable with the `--fix` option." in run.stderr
    assert "1 hidden fix can be enabled with the `--unsafe-fixes` option." in run.stderr


def test_unsafe_fixes_marks_unsafe_fixes_fixable(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "--unsafe-fixes", "train.py")
    assert "train.py:4:10: ACC101 [*] " in run.stdout
    assert "[*] 2 fixable" in run.stderr


def test_clean_file_exits_zero(cli, tmp_path):
    (tmp_path / "train.py").write_text(CLEAN)
    run = cli("lint", *SELECT, "train.py")
    assert (run.exit_code, run.stdout) == (0, "")
    assert "All checks passed!" in run.stderr


def test_quiet_prints_no_summary(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "--quiet", "train.py")
    assert run.exit_code == 1
    assert run.stderr == ""


def test_exit_zero_with_findings(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    assert cli("lint", *SELECT, "--exit-zero", "train.py").exit_code == 0


def test_statistics_counts_per_rule(cli, tmp_path):
    (tmp_path / "a.py").write_text(SCRIPT)
    (tmp_path / "b.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "--statistics", "a.py", "b.py")
    assert run.stdout.splitlines() == [
        "    2\tACC101\tdataloader-without-workers",
        "    2\tACC102\tdataloader-without-pin-memory",
    ]


def test_missing_path_exits_two_and_still_lints_the_rest(cli, tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "nope.py", "train.py")
    assert run.exit_code == 2
    assert "nope.py:1:1: error: no such file or directory" in run.stderr
    assert "train.py:4:10: ACC101" in run.stdout


def test_syntax_error_is_located_others_checked_file_untouched(cli, tmp_path):
    broken = "import torch\n\ndef f(:\n    pass\n"
    (tmp_path / "broken.py").write_text(broken)
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, "--fix", "--unsafe-fixes", "broken.py", "train.py")
    assert run.exit_code == 2
    error_lines = [line for line in run.stderr.splitlines() if line.startswith("broken.py:")]
    assert len(error_lines) == 1
    assert error_lines[0].startswith("broken.py:3:")
    assert "SyntaxError" in error_lines[0]
    assert (tmp_path / "broken.py").read_text() == broken
    assert (tmp_path / "train.py").read_text() != SCRIPT  # the good file was still fixed


def test_output_is_sorted_by_file_line_column(cli, tmp_path):
    two_loaders = (
        SCRIPT + "other = DataLoader(dataset)\nfor x, y in other:\n    model(x).backward()\n"
    )
    for name in ("b.py", "a.py", "sub/c.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(two_loaders)
    run = cli("lint", "--select", "ACC101", "b.py", "sub", "a.py")
    locations = [line.split(": ")[0] for line in run.stdout.splitlines()]
    assert locations == [
        "a.py:4:10",
        "a.py:8:9",
        "b.py:4:10",
        "b.py:8:9",
        f"sub{os.sep}c.py:4:10",
        f"sub{os.sep}c.py:8:9",
    ]


def test_fix_applies_safe_fixes_only(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    run = cli("lint", *SELECT, "--fix", "train.py")
    assert run.exit_code == 1  # the unsafe ACC101 remains
    assert "DataLoader(dataset, batch_size=32, pin_memory=torch.cuda.is_available())" in (
        path.read_text()
    )
    assert run.stdout == f"train.py:4:10: {ACC101}\n"
    assert "Found 2 errors (1 fixed, 1 remaining)." in run.stderr


def test_fix_with_unsafe_fixes_fixes_everything(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    run = cli("lint", *SELECT, "--fix", "--unsafe-fixes", "train.py")
    assert (run.exit_code, run.stdout) == (0, "")
    text = path.read_text()
    assert text.startswith("import os\n")
    assert "num_workers=min(8, os.cpu_count() or 1)" in text
    assert "persistent_workers=True" in text
    assert "Found 2 errors (2 fixed, 0 remaining)." in run.stderr


def test_fix_keeps_crlf_and_permissions_and_leaves_no_temporary_file(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(SCRIPT.replace("\n", "\r\n").encode())
    path.chmod(0o755)
    cli("lint", *SELECT, "--fix", "train.py")
    data = path.read_bytes()
    assert b"pin_memory=torch.cuda.is_available()" in data
    assert data.count(b"\r\n") == data.count(b"\n") == SCRIPT.count("\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_fix_keeps_the_coding_cookie_encoding(cli, tmp_path):
    path = tmp_path / "train.py"
    source = "# -*- coding: latin-1 -*-\n# café\n" + SCRIPT
    path.write_bytes(source.encode("latin-1"))
    cli("lint", *SELECT, "--fix", "train.py")
    assert path.read_bytes().decode("latin-1").startswith("# -*- coding: latin-1 -*-\n# café\n")


def test_diff_writes_nothing_and_exits_one(cli, tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    run = cli("lint", *SELECT, "--diff", "train.py")
    assert run.exit_code == 1
    assert path.read_text() == SCRIPT
    assert run.stdout.startswith("--- train.py\n+++ train.py\n")
    assert "-loader = DataLoader(dataset, batch_size=32)\n" in run.stdout
    assert (
        "+loader = DataLoader(dataset, batch_size=32, pin_memory=torch.cuda.is_available())\n"
        in (run.stdout)
    )
    assert run.stderr == "Would fix 1 error.\n"


def test_diff_without_changes_exits_zero(cli, tmp_path):
    (tmp_path / "train.py").write_text(CLEAN)
    run = cli("lint", *SELECT, "--diff", "train.py")
    assert (run.exit_code, run.stdout, run.stderr) == (0, "", "No errors would be fixed.\n")


def test_stdin_is_linted_as_dash(cli):
    run = cli("lint", *SELECT, "-", input=SCRIPT)
    assert run.exit_code == 1
    assert run.stdout.splitlines() == [f"-:4:10: {ACC101}", f"-:4:10: {ACC102}"]


def test_stdin_fix_writes_fixed_code_to_stdout(cli):
    run = cli("lint", *SELECT, "--fix", "-", input=SCRIPT)
    assert run.stdout == SCRIPT.replace(
        "batch_size=32)", "batch_size=32, pin_memory=torch.cuda.is_available())"
    )
    assert f"-:4:10: {ACC101}" in run.stderr
    assert run.exit_code == 1


def test_stdin_fix_without_changes_echoes_the_input(cli):
    run = cli("lint", *SELECT, "--fix", "-", input=CLEAN)
    assert (run.exit_code, run.stdout) == (0, CLEAN)


def test_file_without_torch_is_not_parsed(cli, tmp_path, monkeypatch):
    # Not even parsed: a syntax error in a file that never says "torch" goes unnoticed.
    (tmp_path / "util.py").write_text("def f(:\n    from mylib import DataLoader\n")
    assert cli("lint", "util.py").exit_code == 0

    def fail(source):
        raise AssertionError("parsed a file without torch")

    monkeypatch.setattr("autoaccel.lint.engine.parse_checked", fail)
    (tmp_path / "plain.py").write_text("from mylib import DataLoader\nDataLoader(ds)\n")
    assert cli("lint", "plain.py").exit_code == 0


@pytest.mark.parametrize("mode", [Mode.CHECK, Mode.DIFF])
def test_parallel_results_equal_sequential(tmp_path, monkeypatch, mode):
    variants = [
        SCRIPT,
        CLEAN,
        SCRIPT + "x = DataLoader(ds, num_workers=0)\nfor b in x:\n    b.backward()\n",
        "print('hi')\n",
    ]
    paths = []
    for index in range(8):
        path = tmp_path / f"f{index}.py"
        path.write_text(variants[index % len(variants)])
        paths.append(path)
    overrides = Overrides(select=("ACC101", "ACC102"), unsafe_fixes=True)
    parallel = lint_files(paths, overrides, mode)
    monkeypatch.setattr(runner, "PARALLEL_THRESHOLD", 10**9)
    sequential = lint_files(paths, overrides, mode)
    assert parallel == sequential
    if mode is Mode.CHECK:  # two findings per loader, three loaders in two files each
        assert sum(len(r.diagnostics) for r in parallel) == 2 * 2 + 2 * 4
    else:  # every finding has a fix (unsafe ones included): diffs, nothing remains
        assert [bool(r.diff) for r in parallel] == [True, False, True, False] * 2
        assert all(r.diagnostics == [] for r in parallel)


def test_parallel_run_through_the_cli_is_sorted_and_complete(cli, tmp_path):
    for index in range(6):
        (tmp_path / f"f{index}.py").write_text(SCRIPT)
    run = cli("lint", *SELECT, ".")
    assert run.exit_code == 1
    assert [line.split(":")[0] for line in run.stdout.splitlines()] == [
        f"f{index}.py" for index in range(6) for _ in range(2)
    ]


def test_a_crashing_rule_is_reported_and_the_run_goes_on(cli, tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text(SCRIPT)
    (tmp_path / "b.py").write_text(SCRIPT.replace("batch_size=32", "crash=1"))
    real = runner.analyse

    def analyse(text, settings, path=None, script=None):
        if "crash" in text:
            raise RuntimeError("boom")
        return real(text, settings, path, script=script)

    monkeypatch.setattr(runner, "analyse", analyse)
    run = cli("lint", *SELECT, "a.py", "b.py")
    assert run.exit_code == 2
    assert "b.py:1:1: internal error: RuntimeError: boom" in run.stderr
    assert "a.py:4:10: ACC101" in run.stdout


def test_fix_is_never_applied_to_a_line_that_suppresses_it_after_reformatting():
    # The fix of ACC102 makes black split the call and move the comment to the
    # closing bracket; ACC101 must stay suppressed (and unfixed) in the next round.
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "train_loader = DataLoader(train_dataset, batch_size=64, shuffle=True, drop_last=True)"
        "  # noqa: ACC101\nmodel.cuda()\nfor x, y in train_loader:\n    model(x).backward()\n"
    )
    result = fix_source(source, LintSettings(select=("ACC101", "ACC102"), unsafe_fixes=True))
    assert "pin_memory=torch.cuda.is_available()" in result.source
    assert "num_workers" not in result.source
    assert result.source.count("# noqa: ACC101") == 1
    assert result.remaining == []


def test_rules_lists_every_rule(cli):
    run = cli("rules")
    assert run.exit_code == 0
    lines = run.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [rule.code for rule in all_rules()]
    acc101 = next(line for line in lines if line.startswith("ACC101"))
    assert acc101.split()[1:3] == ["fix", "dataloader-without-workers"]


def test_rules_prints_one_doc(cli):
    run = cli("rules", "acc101")
    assert run.exit_code == 0
    assert run.stdout.startswith("# ACC101 dataloader-without-workers\n")
    assert "## Why is this slow?" in run.stdout


def test_rules_unknown_code_exits_two(cli):
    run = cli("rules", "ACC999")
    assert run.exit_code == 2
    assert "unknown rule code" in run.stderr


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(cli, flag):
    run = cli(flag)
    assert (run.exit_code, run.stdout) == (0, f"autoaccel {__version__}\n")


@pytest.mark.parametrize("args", [["-h"], ["lint", "-h"], ["convert", "-h"], ["bench", "-h"]])
def test_short_help(cli, args):
    run = cli(*args)
    assert run.exit_code == 0
    assert run.stdout.startswith("Usage: autoaccel")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--select", "FOO", "error: --select: unknown rule selector `FOO`\n"),
        (
            "--ignore",
            "ACC1O1",
            "error: --ignore: unknown rule selector `ACC1O1`, did you mean `ACC101`",
        ),
        ("--extend-select", "ACC9", "error: --extend-select: unknown rule selector `ACC9`\n"),
    ],
)
def test_unknown_rule_selector_exits_two(cli, tmp_path, option, value, message):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = cli("lint", option, value, "train.py")
    assert (run.exit_code, run.stdout) == (2, "")
    assert run.stderr.startswith(message)
    assert "All checks passed!" not in run.stderr


def test_only_missing_paths_is_an_error_not_a_pass(cli):
    run = cli("lint", "missing.py")
    assert run.exit_code == 2
    assert run.stderr == "missing.py:1:1: error: no such file or directory\n"


@pytest.mark.parametrize(
    ("env", "coloured"),
    [({}, False), ({"FORCE_COLOR": "1"}, True), ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False)],
)
def test_text_colour_follows_force_color_and_no_color(tmp_path, env, coloured):
    (tmp_path / "train.py").write_text(SCRIPT)
    clean = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR")}
    run = subprocess.run(
        [sys.executable, "-m", "autoaccel", "lint", *SELECT, "train.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**clean, **env},
    )
    plain = f"train.py:4:10: {ACC101}\ntrain.py:4:10: {ACC102}\n"
    if coloured:
        assert run.stdout.startswith("\033[1mtrain.py\033[0m:4:10: \033[1;31mACC101\033[0m `Data")
        assert " \033[36m[*]\033[0m " in run.stdout
        assert re.sub("\033\\[[0-9;]*m", "", run.stdout) == plain
    else:
        assert run.stdout == plain  # piped: no colour


def test_text_is_coloured_on_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    terminal = io.StringIO()
    terminal.isatty = lambda: True
    assert use_colour(terminal)
    assert not use_colour(io.StringIO())


PLAIN_CALLS = [(), ("--quiet",), ("--fix",), ("--diff", "-q"), ("--unsafe-fixes", "--exit-zero")]


def _main(args: list[str], cwd) -> subprocess.CompletedProcess:
    """`autoaccel.__main__.main` with `args`; also prints whether typer got imported."""
    code = (
        "import sys\nfrom autoaccel.__main__ import main\n"
        f"sys.argv = ['autoaccel', *{args!r}]\n"
        "try:\n    main()\nfinally:\n    print('typer' in sys.modules, file=sys.stderr)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("flags", PLAIN_CALLS, ids=" ".join)
def test_plain_lint_call_skips_typer_with_the_same_result(tmp_path, flags):
    """Paths and on/off flags (the pre-commit hooks' calls) are run without typer;
    anything else, here `--format text`, is parsed by typer. Both give the same
    output, exit code and file."""
    results = []
    for parsed_by_typer in (False, True):
        (tmp_path / "train.py").write_text(SCRIPT)
        extra = ["--format", "text"] if parsed_by_typer else []
        run = _main(["lint", *flags, *extra, "train.py"], tmp_path)
        *report, typer_imported = run.stderr.splitlines()
        assert typer_imported == str(parsed_by_typer)
        results.append((run.returncode, run.stdout, report, (tmp_path / "train.py").read_text()))
    assert results[0] == results[1]
    assert results[0][0] in (0, 1), results[0]


def test_plain_flags_are_the_on_off_options_typer_declares():
    declared = {
        spelling: name
        for name, parameter in inspect.signature(cli.lint).parameters.items()
        if parameter.default.default is False
        for spelling in parameter.default.param_decls
    }
    assert PLAIN_FLAGS == declared


@pytest.mark.parametrize(
    "args", [[], ["a.py", "-", "b"], ["--fix", "-q", "x.py"], list(PLAIN_FLAGS)], ids=repr
)
def test_plain_call_passes_what_typer_passes(monkeypatch, args):
    """Every `run_lint` argument, defaults included, is what the typer command gives."""
    calls = []

    def record(*given, **keywords):
        bound = inspect.signature(run_lint).bind(*given, **keywords)
        bound.apply_defaults()
        calls.append(bound.arguments)
        return 0

    monkeypatch.setattr("autoaccel.lint.command.run_lint", record)
    assert run_plain_call(args) == 0
    assert CliRunner().invoke(cli.app, ["lint", *args]).exit_code == 0
    assert calls[0] == calls[1]


@pytest.mark.parametrize("args", [["--help"], ["--select", "ACC1"], ["--", "x.py"], ["-qq"]])
def test_other_calls_are_left_to_typer(args):
    assert run_plain_call(args) is None


@pytest.mark.parametrize(
    "text", [SCRIPT, "import torch\ndef broken(:\n"], ids=["clean parse", "syntax error"]
)
def test_the_cycle_collector_is_paused_while_a_text_is_analysed(monkeypatch, text):
    analysed_with_collector = []
    real_analyse = runner.analyse

    def analyse(*args, **kwargs):
        analysed_with_collector.append(gc.isenabled())
        return real_analyse(*args, **kwargs)

    monkeypatch.setattr(runner, "analyse", analyse)
    result = runner.lint_text(text, "train.py", LintSettings(), Mode.CHECK)
    assert analysed_with_collector == [False]
    assert gc.isenabled()
    assert bool(result.error) == (text != SCRIPT)
