"""ResNet-18/34/50/101/152 with torchvision's exact layout, parameter names and init.

ResNet v1.5: the stride of a downsampling Bottleneck sits on its 3x3 convolution, and the shortcut
is conv1x1 + BatchNorm. Parameter counts at 1000 classes equal torchvision's: resnet18 11,689,512,
resnet34 21,797,672, resnet50 25,557,032, resnet101 44,549,160, resnet152 60,192,808. Module names
match torchvision too, so its checkpoints load with ``load_state_dict``.

The BatchNorm layers are plain ``nn.BatchNorm2d``; how they run under FSDP mixed precision is the
worker's business.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn


def conv2d_macs(conv: nn.Conv2d, height: int, width: int) -> tuple[int, int, int]:
    """Multiply-accumulates of one image through `conv`, and the output height and width."""
    if isinstance(conv.padding, str):  # "same" / "valid": no numbers to count with
        raise ValueError(f"conv2d_macs needs numeric padding, got padding={conv.padding!r}")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    macs = out_h * out_w * conv.out_channels * (conv.in_channels // conv.groups) * kh * kw
    return macs, out_h, out_w


def pool_out(pool: nn.MaxPool2d, height: int, width: int) -> tuple[int, int]:
    """The output height and width of `pool` (kernel, stride and padding given as ints)."""
    kernel, stride, padding = pool.kernel_size, pool.stride, pool.padding
    if not (isinstance(kernel, int) and isinstance(stride, int) and isinstance(padding, int)):
        raise TypeError(f"pool_out needs int kernel_size, stride and padding, got {pool!r}")
    return (height + 2 * padding - kernel) // stride + 1, (width + 2 * padding - kernel) // stride + 1


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


def _shortcut_macs(downsample: nn.Sequential | None, height: int, width: int) -> int:
    if downsample is None:
        return 0
    conv = downsample[0]
    if not isinstance(conv, nn.Conv2d):
        raise TypeError(f"a shortcut starts with its conv1x1, not {type(conv).__name__}")
    return conv2d_macs(conv, height, width)[0]


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Sequential | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)

    def forward_macs(self, height: int, width: int) -> tuple[int, int, int]:
        macs1, h, w = conv2d_macs(self.conv1, height, width)
        macs2, h, w = conv2d_macs(self.conv2, h, w)
        return macs1 + macs2 + _shortcut_macs(self.downsample, height, width), h, w


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Sequential | None = None) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)  # v1.5: the stride is here, not on conv1
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)

    def forward_macs(self, height: int, width: int) -> tuple[int, int, int]:
        total, h, w = 0, height, width
        for conv in (self.conv1, self.conv2, self.conv3):
            macs, h, w = conv2d_macs(conv, h, w)
            total += macs
        return total + _shortcut_macs(self.downsample, height, width), h, w


# Depth -> (block type, blocks per stage), torchvision's table.
RESNET_LAYOUTS: dict[int, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
    152: (Bottleneck, (3, 8, 36, 3)),
}


class ResNet(nn.Module):
    """Image classifier: float images [B, 3, H, W] -> logits [B, num_classes]."""

    def __init__(self, depth: int = 50, num_classes: int = 1000, zero_init_residual: bool = False) -> None:
        super().__init__()
        if depth not in RESNET_LAYOUTS:
            raise ValueError(f"depth={depth} is not a ResNet; use one of {sorted(RESNET_LAYOUTS)}.")
        block, counts = RESNET_LAYOUTS[depth]
        self.zero_init_residual = zero_init_residual
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, counts[0])
        self.layer2 = self._make_layer(block, 128, counts[1], stride=2)
        self.layer3 = self._make_layer(block, 256, counts[2], stride=2)
        self.layer4 = self._make_layer(block, 512, counts[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int,
                    stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    # The model's own layers around its blocks, as methods the worker compiles on their own when the
    # blocks are compiled one by one (jobs/compiling.py: under FSDP, whose hooks sit between them).
    compile_regions = ("stem", "head")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.head(x)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def custom_init(self) -> None:
        """torchvision's init: Kaiming-normal (fan_out) convolutions, unit BatchNorms.

        The fc layer keeps nn.Linear's own init, as in torchvision.
        """
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if self.zero_init_residual:
            # Each residual branch starts as identity (Goyal et al., "ImageNet in 1 hour").
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.zeros_(module.bn3.weight)
                elif isinstance(module, BasicBlock):
                    nn.init.zeros_(module.bn2.weight)

    def shard_units(self) -> list[nn.Module]:
        return [block for layer in (self.layer1, self.layer2, self.layer3, self.layer4) for block in layer]

    def forward_macs(self, image_size: int) -> int:
        """Convolution and fc multiply-accumulates for one square image, from the layer shapes.

        BatchNorm, ReLU, pooling and the residual additions are left out, as in the published
        figures (ResNet-50 at 224: 4.09 GMACs).
        """
        total, h, w = conv2d_macs(self.conv1, image_size, image_size)
        h, w = pool_out(self.maxpool, h, w)
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in layer:
                # A block, or a CheckpointWrapper that forwards attributes to it (models.replace_units):
                # typed as the block, not checked with isinstance.
                macs, h, w = cast(BasicBlock | Bottleneck, block).forward_macs(h, w)
                total += macs
        return total + self.fc.in_features * self.fc.out_features
