"""Facts from a short run (`autoaccel.facts`): the recorder's JSON, the loader, and the
resolution of recorded positions to LibCST nodes.

The static tests read snapshots of the facts the recorder wrote for the fixtures of
fixtures/facts/ (tests/snapshots/facts/, paths relative to the repository; the test that
they are current is in tests/test_facts_convert_runs.py). The tests marked `runs` run the
recorder on a tiny script of their own.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source
from autoaccel.facts.model import Forward, RunFacts, Seen, Site, batch_first
from autoaccel.facts.resolve import ConversionFacts, FactsResolver

ROOT = Path(__file__).resolve().parent.parent
FACTS_FIXTURES = ROOT / "fixtures" / "facts"
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "facts"
DDP = ConvertOptions(target="ddp", amp="off")
FSDP = ConvertOptions(target="fsdp", amp="off")


def code(node: cst.CSTNode | None) -> str | None:
    return None if node is None else cst.Module([]).code_for_node(node)


def absolute(data: dict, root: Path = ROOT) -> dict:
    """A snapshot with its paths made absolute, and the digests of its files as they are."""

    def walk(value):
        if isinstance(value, dict):
            return {
                k: str(root / v) if k == "path" and isinstance(v, str) else walk(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [walk(item) for item in value]
        return value

    data = walk(data)
    paths = {
        site["path"]
        for kind in ("modules", "optimizers", "loaders", "calls", "forwards")
        for item in data.get(kind, [])
        for site in [item.get("site")]
        if site
    }
    data["files"] = {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}
    data.setdefault("script", "")
    return data


def snapshot(name: str) -> tuple[RunFacts, Path, str]:
    facts = RunFacts.from_json(absolute(json.loads((SNAPSHOTS / f"{name}.json").read_text())))
    path = FACTS_FIXTURES / f"{name}.py"
    return facts, path, path.read_text(encoding="utf-8")


def resolver(name: str) -> FactsResolver:
    facts, path, source = snapshot(name)
    return FactsResolver(facts, path, cst.parse_module(source))


# -- the loader ---------------------------------------------------------------------------------
def test_loader_reads_every_kind_of_fact():
    facts, path, _ = snapshot("kwargs_trainer")
    assert [m.cls for m in facts.trained_modules()] == ["__main__.Net"]
    assert [o.cls for o in facts.stepping_optimizers()] == ["torch.optim.sgd.SGD"]
    assert {c.kind for c in facts.calls} == {"backward", "step", "zero_grad"}
    assert facts.loaders and facts.samplers and not facts.schedulers
    forward = facts.forwards_of(facts.trained_modules()[0].id)
    assert [f.args for f in forward] == [((32, 8),)]
    assert [f.seen for f in forward] == [(Seen(32, ((32, 8),), ((32, 1),), 5),)]
    assert facts.ran_steps and facts.steps == 5
    assert facts.in_file(path)


def test_loader_refuses_another_version():
    with pytest.raises(ValueError, match="version"):
        RunFacts.from_json({"version": 99, "script": "", "exit": "ok", "steps": 0})


# -- the batch-first rule (hand-made facts, no run) --------------------------------------------------
SITE = Site("t.py", 1, 0, 1, 8)


def first_argument(*seen: Seen, count: int | None = None):
    """The rule's answer for argument 0 at a site whose calls saw `seen`."""
    total = sum(s.count for s in seen) if count is None else count
    return batch_first([Forward(1, SITE, total, seen[0].args, seen)], lambda s: s.args[0])


def calls(batch, shape, count=5) -> Seen:
    return Seen(batch, (shape,), (), count)


@pytest.mark.parametrize(
    ("seen", "known", "why"),
    [
        pytest.param([calls(10, (10, 16))], True, "dimension 0 is the batch on all 5 calls", id="flattened"),
        pytest.param([calls(16, (16, 16))], None, "ambiguous", id="len-equals-batch"),
        # the last, smaller batch tells the batch dimension from one that happens to equal it
        pytest.param([calls(16, (16, 16), 4), calls(4, (4, 16), 1)], True, "on all 5 calls", id="last-batch"),
        pytest.param([calls(16, (16, 16), 4), calls(4, (16, 4), 1)], False, "[16, 4] in a step of 4", id="sequence-first-last-batch"),
        pytest.param([calls(10, (20, 10))], False, "shape [20, 10] in a step of 10 samples", id="sequence-first"),
        pytest.param([calls(10, (10, 16)), calls(10, (10, 16, 2))], None, "ambiguous", id="ranks-differ"),
        pytest.param([calls(None, (10, 16))], None, "no DataLoader batch", id="no-loader"),
        pytest.param([calls(10, "int")], None, "no tensor", id="not-a-tensor"),
        pytest.param([calls(10, ())], None, "no tensor", id="a-scalar"),
    ],
)  # fmt: skip
def test_batch_first_rule(seen, known, why):
    shown = first_argument(*seen)
    assert shown.known is known and why in shown.why


def test_batch_first_rule_cannot_tell_when_calls_went_unrecorded():
    # more groups than MAX_SEEN: the kept ones count fewer calls than the site made
    assert first_argument(calls(10, (10, 16)), count=9).known is None


def test_site_shows_a_character_column():
    source = 'x = {"é": f()}\n'
    assert Site("t.py", 1, 11, 1, 14).shown(source) == "t.py:1:11"  # byte 11 is character 10


# -- resolution ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, made, called",
    [
        ("kwargs_trainer", "Net()", "self.model(x)"),
        ("model_factory", "globals()[name]()", "model(x)"),
        ("model_dict", "Net()", 'models["net"](x)'),
        ("trainer_setup", "Net()", "self.model(x)"),
    ],
)
def test_the_trained_model_resolves_to_the_call_that_made_it(name, made, called):
    facts = resolver(name)
    [creation] = facts.trained_model_calls()
    assert code(creation) == made
    [forward] = [f for f in facts.facts.forwards if f.module == facts.trained_models()[0].id]
    node = facts.node_at(forward.site)
    assert code(node) == called
    assert facts.trained_at(node) == facts.trained_models()


def test_backward_step_and_zero_grad_resolve_to_their_calls():
    facts = resolver("kwargs_trainer")
    assert [code(n) for n in facts.calls_of("backward")] == ["loss.backward()"]
    assert [code(n) for n in facts.calls_of("step")] == ["self.optimizer.step()"]
    assert [code(n) for n in facts.calls_of("zero_grad")] == ["self.optimizer.zero_grad()"]
    [optimizer] = facts.facts.stepping_optimizers()
    assert [m.cls for m in facts.made_at(facts.node_at(optimizer.site))] == ["torch.optim.sgd.SGD"]


def test_a_site_after_non_ascii_text_resolves_by_characters(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('names = {"modèle": Net(), "ß": 1}\n', encoding="utf-8")
    line = script.read_text(encoding="utf-8").splitlines()[0]
    start = len(line[: line.index("Net()")].encode("utf-8"))  # 20 bytes, 19 characters
    site = {"path": str(script), "line": 1, "col": start, "end_line": 1, "end_col": start + 5}
    data = absolute(
        {
            "version": 1,
            "exit": "ok",
            "steps": 1,
            "modules": [{"id": 1, "cls": "m.Net", "site": site}],
        },
        tmp_path,
    )
    facts = FactsResolver(RunFacts.from_json(data), script, cst.parse_module(script.read_text()))
    assert start == 20 and facts.char_column(1, start) == 19
    assert code(facts.node_at(facts.facts.modules[0].site)) == "Net()"


def test_a_file_changed_since_the_run_resolves_nothing():
    facts, path, source = snapshot("kwargs_trainer")
    changed = source.replace("lr=0.05", "lr=0.1")
    stale = FactsResolver(facts, path, cst.parse_module(changed), changed)
    assert not stale.current and stale.trained_model_calls() == []


def test_sites_in_another_file_resolve_to_nothing():
    facts, _, source = snapshot("kwargs_trainer")
    elsewhere = FactsResolver(
        facts, FACTS_FIXTURES / "model_dict.py", cst.parse_module(source), source
    )
    assert elsewhere.trained_model_calls() == []


# -- the consumer: convert --to ddp|fsdp with the facts --------------------------------------------
def converted(name: str, options: ConvertOptions, with_facts: bool):
    facts, path, source = snapshot(name)
    given = ConversionFacts(facts, path, source) if with_facts else None
    return convert_source(source, options, str(path), given)


def wrong(conversion) -> list[str]:
    return [s.reason for s in conversion.log.skipped if s.wrong]


@pytest.mark.parametrize("name", ["kwargs_trainer", "model_factory"])
def test_static_conversion_refuses_without_facts(name):
    assert any("no trained model was recognised" in r for r in wrong(converted(name, DDP, False)))


@pytest.mark.parametrize(
    "name, anchor, forward",
    [
        ("kwargs_trainer", "self.ddp_model = self.model", "mse_loss(self.ddp_model(x), y)"),
        ("model_factory", "ddp_model = model", "mse_loss(ddp_model(x), y)"),
    ],
)
def test_facts_let_the_wrap_step_wrap_the_trained_model(name, anchor, forward):
    conversion = converted(name, DDP, True)
    assert wrong(conversion) == []
    assert anchor in conversion.converted and forward in conversion.converted


@pytest.mark.parametrize(
    "name, key", [("kwargs_trainer", "self.model"), ("model_factory", "model")]
)
def test_facts_let_fsdp_shard_the_trained_model(name, key):
    conversion = converted(name, FSDP, True)
    assert wrong(conversion) == []
    assert f"shard_model({key})" in conversion.converted


def test_a_model_in_a_container_is_refused_with_what_the_run_showed():
    # (--to ddp wraps `models["net"]`: tests/test_convert_project_facts.py)
    reasons = wrong(converted("model_dict", FSDP, True))
    [facts] = [r for r in reasons if "the run shows" in r]
    assert "`Net()` made at fixtures/facts/model_dict.py:36:18" in facts
    assert '`models["net"](x)` at fixtures/facts/model_dict.py:43:39' in facts


# -- the command line ---------------------------------------------------------------------------
def test_no_run_keeps_the_static_refusal(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(FACTS_FIXTURES)
    result = cli("convert", "kwargs_trainer.py", "--to", "ddp", "--no-run")
    assert result.exit_code == 1
    assert (
        "no trained model was recognised" in result.stderr
        and "running the script" not in result.stderr
    )


def test_script_arguments_still_need_a_target_that_runs(cli, tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    stray = cli("convert", str(tmp_path / "train.py"), "--", "--epochs", "1")
    assert stray.exit_code == 2 and "unexpected arguments" in stray.stderr


def test_the_pull_request_preview_never_runs_a_script():
    from autoaccel.ci import github

    assert '"--no-run"' in Path(github.__file__).read_text()


def test_facts_and_static_convert_import_without_torch():
    code_ = textwrap.dedent("""\
        import sys
        import autoaccel.facts, autoaccel.facts.resolve, autoaccel.facts.recorder
        import autoaccel.convert.command, autoaccel.convert.transforms.distributed._base
        print("torch" in sys.modules)
        """)
    run = subprocess.run([sys.executable, "-c", code_], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "False\n"


# -- the recorder (runs torch) ------------------------------------------------------------------
TINY = """\
import torch
import torch.nn as nn

OUT = {out!r}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)


frozen = nn.Linear(4, 4)
net = {{"modèle": Net()}}["modèle"]  # (a line with non-ASCII text before the call)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
for (x,) in loader:
    opt.zero_grad()
    loss = net(frozen(x)).pow(2).mean()
    loss.backward()
    opt.step()
    sched.step()
    print("loss", float(loss))
torch.save(net.state_dict(), OUT + ".pt")
with open(OUT + ".txt", "w") as log:
    log.write("done")
"""


@pytest.fixture(scope="module")
def tiny_facts(tmp_path_factory):
    from autoaccel.run.facts import FactsRequest, collect_facts

    folder = tmp_path_factory.mktemp("tiny")
    script = folder / "tiny.py"
    script.write_text(TINY.format(out=str(folder / "written")), encoding="utf-8")
    ran = collect_facts(script, FactsRequest([], steps=10))
    assert ran.facts is not None, ran.error
    return ran.facts, script, folder


def site_text(script: Path, site: Site) -> str:
    facts = RunFacts(script="", exit="ok", steps=0, files={})
    return FactsResolver(
        facts, script, cst.parse_module(script.read_text()), script.read_text()
    ).text_of(site)


@pytest.mark.runs
def test_recorder_notes_where_each_object_was_made(tiny_facts):
    facts, script, _ = tiny_facts
    assert facts.exit == "ok" and facts.steps == 4
    made = {m.cls.rpartition(".")[2]: m for m in facts.modules}
    net = made["Net"]
    # the call that made it, not `super().__init__()` inside the class; byte columns
    assert (net.site.line, net.site.col, net.site.end_col) == (17, 18, 23)  # 17 characters in
    assert site_text(script, net.site) == "Net()"
    inner = [m for m in facts.modules if m.cls.endswith("Linear") and m.site.line == 10]
    assert [site_text(script, m.site) for m in inner] == ["nn.Linear(4, 1)"]
    [optimizer] = facts.optimizers
    assert site_text(script, optimizer.site) == "torch.optim.SGD(net.parameters(), lr=0.1)"
    assert [m.cls for m in facts.trained_modules()] == ["__main__.Net"]  # the root, not fc
    assert len(optimizer.modules) == 2 and optimizer.roots == (net.id,)
    assert [site_text(script, s.site) for s in facts.schedulers] == [
        "torch.optim.lr_scheduler.StepLR(opt, 1)"
    ]
    [loader] = facts.loaders
    assert loader.direct and all(not s.direct and s.site == loader.site for s in facts.samplers)


@pytest.mark.runs
def test_recorder_notes_calls_forwards_writes_and_prints(tiny_facts):
    facts, script, folder = tiny_facts
    texts = {(c.kind, site_text(script, c.site)): c.count for c in facts.calls}
    assert texts == {
        ("zero_grad", "opt.zero_grad()"): 4,
        ("backward", "loss.backward()"): 4,
        ("step", "opt.step()"): 4,
    }
    # top-level calls only: `net(...)` and `frozen(x)`, not `self.fc(x)` inside Net.forward
    forwards = {site_text(script, f.site): (f.count, f.args) for f in facts.forwards}
    assert forwards == {"net(frozen(x))": (4, ((4, 4),)), "frozen(x)": (4, ((4, 4),))}
    # each call with the samples of its step's batch (4 of the loader's 16) and its outputs
    seen = {site_text(script, f.site): f.seen for f in facts.forwards}
    assert seen == {
        "net(frozen(x))": (Seen(4, ((4, 4),), ((4, 1),), 4),),
        "frozen(x)": (Seen(4, ((4, 4),), ((4, 4),), 4),),
    }
    writes = {(w.kind, site_text(script, w.site)) for w in facts.writes}
    assert writes == {
        ("torch.save", 'torch.save(net.state_dict(), OUT + ".pt")'),
        ("open", 'open(OUT + ".txt", "w")'),
    }
    assert (
        not (folder / "written.txt").exists() and not (folder / "written.pt").exists()
    )  # the scratch got them
    assert [(site_text(script, p.site), p.count) for p in facts.prints] == [
        ('print("loss", float(loss))', 4)
    ]
