"""Convolutional models: ResNet (He et al., CVPR'16) and VGG (Simonyan & Zisserman, ICLR'15)."""

from __future__ import annotations

from torch import nn

_RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3),
                  152: (3, 8, 36, 3)}
_VGG_CFG = {11: (1, 1, 2, 2, 2), 13: (2, 2, 2, 2, 2), 16: (2, 2, 3, 3, 3), 19: (2, 2, 4, 4, 4)}


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = x if self.down is None else self.down(x)
        return self.relu(y + s)


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        s = x if self.down is None else self.down(x)
        return self.relu(y + s)


class ResNet(nn.Module):
    """ResNet-18/34 (basic blocks) or -50/101/152 (bottlenecks), `width` channels in the stem."""

    def __init__(self, depth: int = 50, width: int = 64, classes: int = 1000, image: int = 224):
        super().__init__()
        if depth not in _RESNET_BLOCKS:
            raise ValueError(f"depth must be one of {sorted(_RESNET_BLOCKS)}")
        block = _Basic if depth < 50 else _Bottleneck
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, n in enumerate(_RESNET_BLOCKS[depth]):
            w = width * 2**i
            for j in range(n):
                layers.append(block(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w * block.expansion
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


class VGG(nn.Module):
    """VGG-11/13/16/19: 3x3 convolutions with max-pooling, then two `hidden`-wide dense layers."""

    def __init__(self, depth: int = 16, width: int = 64, classes: int = 1000, image: int = 224,
                 hidden: int = 4096):
        super().__init__()
        if depth not in _VGG_CFG:
            raise ValueError(f"depth must be one of {sorted(_VGG_CFG)}")
        layers, cin = [], 3
        for i, n in enumerate(_VGG_CFG[depth]):
            w = min(width * 2**i, width * 8)
            for _ in range(n):
                layers += [nn.Conv2d(cin, w, 3, 1, 1), nn.ReLU()]
                cin = w
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        side = max(image // 32, 1)
        self.classifier = nn.Sequential(nn.Linear(cin * side * side, hidden), nn.ReLU(),
                                        nn.Linear(hidden, hidden), nn.ReLU(),
                                        nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
