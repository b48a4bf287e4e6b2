"""`--compile`: the trained model, and only it, is compiled in place once."""

from __future__ import annotations

import textwrap

from autoaccel.convert.log import ConvertOptions
from autoaccel.convert.pipeline import convert_source

COMPILE = ConvertOptions(amp="off", compile=True, workers="keep")

SCRIPT = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            x = F.relu(x)
            return self.fc(x)


    model = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        outputs = model(x)
        loss = criterion(outputs, y)
        loss.backward()
        optimizer.step()
    """)


def compile_lines(code: str) -> list[str]:
    return [line.strip() for line in code.splitlines() if line.strip().endswith(".compile()")]


def test_only_the_model_an_optimizer_trains_is_compiled():
    result = convert_source(SCRIPT, COMPILE)
    assert compile_lines(result.converted) == ["model.compile()"]
    assert "model = Net()\nmodel.compile()\n" in result.converted


def test_every_trained_model_of_a_gan_is_compiled():
    source = SCRIPT.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "critic = Net()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "critic_optimizer = torch.optim.Adam(critic.parameters())\n",
    )
    assert compile_lines(convert_source(source, COMPILE).converted) == [
        "model.compile()",
        "critic.compile()",
    ]


def test_already_compiled_model_is_left_alone():
    source = SCRIPT.replace("model = Net()\n", "model = Net()\nmodel.compile()\n")
    assert convert_source(source, COMPILE).converted == source


def test_without_an_optimizer_the_user_is_told_what_to_do():
    source = SCRIPT.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", ""
    ).replace("optimizer.", "pass  # ")
    result = convert_source(source, COMPILE)
    assert compile_lines(result.converted) == []
    assert [s.what for s in result.log.skipped] == ["torch.compile"]


def test_compile_composes_with_data_parallel_without_compiling_the_wrapper():
    source = SCRIPT.replace("model = Net()", "model = Net().cuda()")  # dp needs a GPU model
    result = convert_source(source, ConvertOptions(amp="off", compile=True, target="dp"))
    assert compile_lines(result.converted) == ["model.compile()"]
    assert "model_with_loss(x, y)" in result.converted


def test_a_model_trained_through_parameter_groups_is_compiled():
    source = SCRIPT.replace(
        "torch.optim.SGD(model.parameters(), lr=0.1)",
        'torch.optim.SGD([{"params": model.parameters()}], lr=0.1)',
    )
    assert compile_lines(convert_source(source, COMPILE).converted) == ["model.compile()"]
