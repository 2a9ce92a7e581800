"""Really pruned test nets for the fastermodels tests, and checks that they are what they claim.

Other fastermodels test files import the builders from here.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
from torch import nn  # noqa: E402

RESNET_SOURCE = "torchvision.models.resnet18"
RESNET_KWARGS = {"num_classes": 10, "weights": None}
MLP_SOURCE = "test_fastermodels_nets.mlp_bn"
MLP_KWARGS = {"in_features": 16, "hidden": 32, "out_features": 4}
# inner conv of each BasicBlock → channels kept (all odd, all below the factory's 64 / 128)
RESNET_KEEP = {"layer1.0": 37, "layer1.1": 45, "layer2.0": 101, "layer2.1": 77}
MLP_KEEP = 21


def mlp_bn(in_features: int = 16, hidden: int = 32, out_features: int = 4) -> nn.Sequential:
    """A model factory with a BatchNorm1d: Linear → BatchNorm1d → ReLU → Linear."""
    return nn.Sequential(nn.Linear(in_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                         nn.Linear(hidden, out_features))


def tied_embeddings(vocab: int = 10, dim: int = 8) -> nn.Sequential:
    """A model factory whose two embeddings share one weight, as an encoder and decoder's do."""
    net = nn.Sequential(nn.Embedding(vocab, dim), nn.Embedding(vocab, dim))
    net[1].weight = net[0].weight
    return net


def randomize_batchnorms(net: nn.Module, seed: int) -> None:
    """Give every BatchNorm non-default statistics and affine weights, so eval mode matters."""
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
            m.num_batches_tracked.fill_(7)


def _kept(weight: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the ``keep`` output channels of largest L1 norm, in their original order."""
    scores = weight.detach().abs().flatten(1).sum(1)
    return scores.argsort(descending=True)[:keep].sort().values


def _pruned_bn(bn: nn.Module, idx: torch.Tensor) -> nn.Module:
    new = type(bn)(len(idx), eps=bn.eps, momentum=bn.momentum)
    for name in ("weight", "bias", "running_mean", "running_var"):
        getattr(new, name).data.copy_(getattr(bn, name).data[idx])
    new.num_batches_tracked.copy_(bn.num_batches_tracked)
    return new


def _out_pruned(layer: nn.Module, idx: torch.Tensor) -> nn.Module:
    """A copy of a Conv2d or Linear keeping only output channels ``idx``."""
    if isinstance(layer, nn.Conv2d):
        new: nn.Module = nn.Conv2d(layer.in_channels, len(idx), layer.kernel_size, layer.stride,
                                   layer.padding, layer.dilation, layer.groups, layer.bias is not None)
    else:
        new = nn.Linear(layer.in_features, len(idx), layer.bias is not None)
    new.weight.data.copy_(layer.weight.data[idx])
    if layer.bias is not None:
        new.bias.data.copy_(layer.bias.data[idx])
    return new


def _in_pruned(layer: nn.Module, idx: torch.Tensor) -> nn.Module:
    """A copy of a Conv2d or Linear keeping only input channels ``idx``."""
    if isinstance(layer, nn.Conv2d):
        new: nn.Module = nn.Conv2d(len(idx), layer.out_channels, layer.kernel_size, layer.stride,
                                   layer.padding, layer.dilation, layer.groups, layer.bias is not None)
    else:
        new = nn.Linear(len(idx), layer.out_features, layer.bias is not None)
    new.weight.data.copy_(layer.weight.data[:, idx])
    if layer.bias is not None:
        new.bias.data.copy_(layer.bias.data)
    return new


def pruned_resnet18(seed: int = 0) -> nn.Module:
    """resnet18 with the inner conv of layer1/layer2 blocks pruned to odd channel counts."""
    torch.manual_seed(seed)
    net = torchvision.models.resnet18(**RESNET_KWARGS)
    randomize_batchnorms(net, seed)
    for block_name, keep in RESNET_KEEP.items():
        block = net.get_submodule(block_name)
        idx = _kept(block.conv1.weight, keep)
        block.conv1 = _out_pruned(block.conv1, idx)
        block.bn1 = _pruned_bn(block.bn1, idx)
        block.conv2 = _in_pruned(block.conv2, idx)
    return net.eval()


def pruned_mlp(seed: int = 0) -> nn.Sequential:
    """`mlp_bn` with its hidden layer pruned from 32 to 21 units."""
    torch.manual_seed(seed)
    net = mlp_bn(**MLP_KWARGS)
    randomize_batchnorms(net, seed)
    idx = _kept(net[0].weight, MLP_KEEP)
    net[0], net[1], net[3] = _out_pruned(net[0], idx), _pruned_bn(net[1], idx), _in_pruned(net[3], idx)
    return net.eval()


def test_pruned_resnet18_has_odd_channels_and_runs() -> None:
    net = pruned_resnet18()
    for block_name, keep in RESNET_KEEP.items():
        block = net.get_submodule(block_name)
        assert keep % 2 == 1
        assert block.conv1.out_channels == block.bn1.num_features == block.conv2.in_channels == keep
    assert net(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    with pytest.raises(RuntimeError):  # the factory's shapes no longer hold these weights
        torchvision.models.resnet18(**RESNET_KWARGS).load_state_dict(net.state_dict())


def test_pruning_keeps_the_kept_weights() -> None:
    torch.manual_seed(0)
    full = torchvision.models.resnet18(**RESNET_KWARGS)
    randomize_batchnorms(full, 0)
    idx = _kept(full.layer1[0].conv1.weight, RESNET_KEEP["layer1.0"])
    pruned = pruned_resnet18()
    assert torch.equal(pruned.layer1[0].conv1.weight, full.layer1[0].conv1.weight[idx])
    assert torch.equal(pruned.layer1[0].conv2.weight, full.layer1[0].conv2.weight[:, idx])
    assert torch.equal(pruned.layer1[0].bn1.running_var, full.layer1[0].bn1.running_var[idx])


def test_pruned_mlp_has_an_odd_hidden_layer() -> None:
    net = pruned_mlp()
    assert net[0].out_features == net[1].num_features == net[3].in_features == MLP_KEEP
    assert net(torch.randn(5, 16)).shape == (5, 4)
