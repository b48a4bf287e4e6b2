"""Findings need evidence that the pattern costs time (issue 31): ACC206 only per step,
ACC301 only where mixed precision pays, ACC402 only where much is gathered, ACC101 only
where workers have work to do. Each false alarm of the issue is a minimal script here."""

from __future__ import annotations

from textwrap import dedent

from autoaccel.config import LintSettings
from autoaccel.lint.engine import lint_source


def lines(source: str, code: str) -> list[int]:
    """The lines `code` reports in `source`."""
    return [d.line for d in lint_source(dedent(source), LintSettings(select=(code,)))]


# -- ACC206: a CPU-built tensor moved to the device, every step -------------------------
RL_SETUP = """\
import torch
device = torch.device("cuda")
obs = torch.zeros((num_steps, num_envs) + obs_shape).to(device)
rewards = torch.zeros((num_steps, num_envs)).to(device)
next_done = torch.zeros(num_envs).to(device)
for iteration in range(iterations):
    for start in range(0, batch_size, minibatch_size):
        loss = agent.loss(obs[start:start + minibatch_size])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_acc206_rollout_buffers_built_once_before_training():
    assert lines(RL_SETUP, "ACC206") == []


def test_acc206_warm_up_and_export_dummies():
    source = """\
    import torch
    model = Net().cuda()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(1, 3, 224, 224).cuda())
    torch.onnx.export(model, torch.randn(1, 3, 224, 224).cuda(), "model.onnx")
    for x, y in loader:
        criterion(model(x.cuda()), y.cuda()).backward()
    """
    assert lines(source, "ACC206") == []


def test_acc206_labels_made_every_step():
    source = """\
    import torch
    device = torch.device("cuda")
    for images, _ in loader:
        real = torch.ones(images.size(0), 1).to(device)
        criterion(D(images.to(device)), real).backward()
    """
    assert lines(source, "ACC206") == [4]


def test_acc206_in_a_method_the_step_calls_built_over_three_lines():
    """SimCLR: `torch.arange` joined by `torch.cat`, compared, then moved two lines on."""
    source = """\
    import torch
    class Contrastive:
        def loss(self, features):
            labels = torch.cat([torch.arange(self.batch_size) for i in range(self.views)], dim=0)
            labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
            labels = labels.to(self.device)
            return (features @ features.T - labels).pow(2).mean()

        def train(self, loader):
            for images, _ in loader:
                loss = self.loss(self.model(images))
                loss.backward()
    """
    (line,) = lines(source, "ACC206")
    assert line == 4
    (finding,) = lint_source(dedent(source), LintSettings(select=("ACC206",)))
    assert "line 6" in finding.message and finding.fix is None


def test_acc206_built_over_lines_at_setup_is_not_reported():
    source = """\
    import torch
    device = torch.device("cuda")
    mask = torch.arange(8)
    mask = (mask.unsqueeze(0) < mask.unsqueeze(1)).float()
    mask = mask.to(device)
    for x, y in loader:
        criterion(model(x) * mask, y).backward()
    """
    assert lines(source, "ACC206") == []


# -- ACC301: mixed precision only where it pays ---------------------------------------
def train(model: str, head: str = "import torch\nfrom torch import nn\n") -> str:
    return head + model + dedent("""\
        model = model.cuda()
        optimizer = torch.optim.Adam(model.parameters())
        for x, y in loader:
            loss = criterion(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)


def test_acc301_rl_policy_of_64_units():
    model = dedent("""\
        class Agent(nn.Module):
            def __init__(self, envs):
                super().__init__()
                obs = int(np.prod(envs.single_observation_space.shape))
                self.critic = nn.Sequential(
                    layer_init(nn.Linear(obs, 64)), nn.Tanh(),
                    layer_init(nn.Linear(64, 64)), nn.Tanh(),
                    layer_init(nn.Linear(64, 1), std=1.0),
                )
                self.actor = nn.Sequential(
                    layer_init(nn.Linear(obs, 64)), nn.Tanh(),
                    layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
                )
        model = Agent(envs)
        """)
    assert lines(train(model), "ACC301") == []


def test_acc301_mnist_size_network():
    model = dedent("""\
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 32, 3, 1)
                self.conv2 = nn.Conv2d(32, 64, 3, 1)
                self.fc1 = nn.Linear(9216, 128)
                self.fc2 = nn.Linear(128, 10)
        model = Net()
        """)
    assert lines(train(model), "ACC301") == []


def test_acc301_graph_network_of_small_width():
    """Message passing: a linear map of width 16, then a scatter-add over the edges."""
    model = dedent("""\
        class GraphConv(nn.Module):
            def __init__(self, in_channels, out_channels):
                super().__init__()
                self.lin = nn.Linear(in_channels, out_channels)

            def forward(self, x, edges):
                h = self.lin(x)
                return torch.zeros_like(h).index_add_(0, edges[1], h[edges[0]])

        class GCN(nn.Module):
            def __init__(self, features, hidden, classes):
                super().__init__()
                self.conv1 = GraphConv(features, hidden)
                self.conv2 = GraphConv(hidden, classes)
        HIDDEN = 16
        model = GCN(dataset.num_features, HIDDEN, 7)
        """)
    assert lines(train(model), "ACC301") == []


def test_acc301_trainer_with_its_own_fp16_path():
    source = """\
    import torch
    class Trainer:
        def __init__(self, model, use_fp16=False):
            self.model = model.cuda()
            self.use_fp16 = use_fp16
            self.opt = torch.optim.AdamW(self.model.parameters())
            self.lg_loss_scale = 20.0

        def run(self, loader):
            for x, y in loader:
                loss = self.model(x.cuda(), y.cuda())
                (loss * 2 ** self.lg_loss_scale).backward()
                self.opt.step()
    """
    assert lines(source, "ACC301") == []


def test_acc301_xpu_only_script():
    head = "import torch\nfrom torch import nn\ntorch.cuda.manual_seed(0)\ndevice = torch.device('xpu')\n"
    model = "model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))\n"
    source = train(model, head).replace(".cuda()", ".to(device)")
    assert lines(source, "ACC301") == []
    # the same script on CUDA is reported
    assert lines(source.replace("'xpu'", "'cuda'"), "ACC301") != []


def test_acc301_wide_layers_are_reported():
    model = "model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))\n"
    assert lines(train(model), "ACC301") == [7]


def test_acc301_atari_network_with_a_3136_by_512_layer():
    model = dedent("""\
        class QNetwork(nn.Module):
            def __init__(self, actions):
                super().__init__()
                self.network = nn.Sequential(
                    nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
                    nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                    nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
                    nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, actions),
                )
        model = QNetwork(6)
        """)
    assert lines(train(model), "ACC301") != []


def test_acc301_width_passed_to_the_constructor():
    model = dedent("""\
        class MLP(nn.Module):
            def __init__(self, width):
                super().__init__()
                self.fc = nn.Linear(width, width)
        model = MLP(64)
        """)
    assert lines(train(model), "ACC301") == []
    assert lines(train(model.replace("MLP(64)", "MLP(2048)")), "ACC301") != []


def test_acc301_sizes_it_cannot_see_are_reported():
    for model in (
        "import torchvision\nmodel = torchvision.models.resnet50()\n",
        "model = nn.Sequential(nn.Linear(args.inputs, args.hidden), nn.ReLU())\n",
    ):
        assert lines(train(model), "ACC301") != [], model


# -- ACC402: the gathered output is one value per sample -------------------------------
DP = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

class Critic(nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.body = nn.Linear(17, width)
        self.head = nn.Linear(width, OUTPUTS)

    def forward(self, x):
        return self.head(F.relu(self.body(x))).squeeze(1)

model = nn.DataParallel(Critic()).cuda()
for x, y in loader:
    out = model(x)
    loss = F.mse_loss(out, y)
    loss.backward()
"""


def test_acc402_one_value_per_sample_is_not_reported():
    assert lines(DP.replace("OUTPUTS", "1"), "ACC402") == []


def test_acc402_many_values_per_sample_are_reported():
    assert lines(DP.replace("OUTPUTS", "1000"), "ACC402") == [17]


def test_acc402_output_width_unknown_is_reported():
    assert lines(DP.replace("OUTPUTS", "args.classes"), "ACC402") == [17]


# -- ACC101: workers for samples already in memory --------------------------------------
TOKENS = """\
import torch
from torch.utils.data import DataLoader, Dataset

class Tokens(Dataset):
    def __init__(self, ids, block):
        self.ids, self.block = ids, block

    def __len__(self):
        return len(self.ids) - self.block

    def __getitem__(self, i):
        chunk = self.ids[i : i + self.block + 1]
        return {"input_ids": torch.tensor(chunk[:-1]), "labels": torch.tensor(chunk[1:])}

loader = DataLoader(Tokens(ids, 128), batch_size=32, shuffle=True)
for batch in loader:
    model(**batch).loss.backward()
"""


def test_acc101_pre_tokenised_ids_in_memory():
    assert lines(TOKENS, "ACC101") == []


def test_acc101_list_of_samples_in_memory():
    source = """\
    from torch.utils.data import DataLoader
    samples = [(torch.tensor(ids[:-1]), torch.tensor(ids[1:])) for ids in tokenised]
    loader = DataLoader(samples, batch_size=32)
    for x, y in loader:
        model(x).sum().backward()
    """
    assert lines(source, "ACC101") == []


def test_acc101_tokenising_per_sample_is_reported():
    source = TOKENS.replace(
        "chunk = self.ids[i : i + self.block + 1]", "chunk = self.tokenizer(self.texts[i])"
    )
    assert lines(source, "ACC101") == [15]
