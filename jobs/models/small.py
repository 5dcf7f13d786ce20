"""Small image models that run in seconds on CPU at image_size 32.

``MLP`` is the smallest thing the training loop can drive. ``CNN`` exists to exercise BatchNorm
(running statistics are buffers, not parameters) under DDP buffer broadcast and FSDP mixed
precision without paying for a ResNet.
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from jobs.models.resnet import conv2d_macs, pool_out


class MLP(nn.Module):
    """Flattened image [B, 3, S, S] -> `n_layer` hidden Linear+ReLU blocks -> [B, num_classes]."""

    def __init__(self, image_size: int, num_classes: int, hidden: int = 256, n_layer: int = 2) -> None:
        super().__init__()
        widths = [3 * image_size * image_size] + [hidden] * n_layer
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU()) for d_in, d_out in pairwise(widths)
        )
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def shard_units(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward_macs(self, image_size: int) -> int:
        del image_size  # fixed by construction: the first Linear's input width
        return sum(m.in_features * m.out_features for m in self.modules() if isinstance(m, nn.Linear))


class ConvBlock(nn.Module):
    """conv3x3 (no bias: BatchNorm follows) -> BatchNorm2d -> ReLU -> 2x2 max-pool (halves H, W)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.relu(self.bn(self.conv(x))))


class CNN(nn.Module):
    """Image [B, 3, S, S] -> `n_layer` ConvBlocks (channels width, 2*width, ...) -> [B, num_classes]."""

    def __init__(self, num_classes: int, width: int = 32, n_layer: int = 3) -> None:
        super().__init__()
        channels = [3] + [width * 2**i for i in range(n_layer)]
        self.blocks = nn.ModuleList(ConvBlock(c_in, c_out) for c_in, c_out in pairwise(channels))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def shard_units(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward_macs(self, image_size: int) -> int:
        """Convolution and fc multiply-accumulates for one image (BatchNorm, ReLU, pooling left out)."""
        total, h, w = 0, image_size, image_size
        for block in self.modules():
            if isinstance(block, ConvBlock):
                macs, h, w = conv2d_macs(block.conv, h, w)
                total += macs
                h, w = pool_out(block.pool, h, w)
        return total + self.fc.in_features * self.fc.out_features
