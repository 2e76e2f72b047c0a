"""Models by name: a registry of builders `(in_channels, num_classes, image_size) -> nn.Module`.

Every model states the input size it is built for (`input_size(image_size)`); the input pipeline
resizes or crops images to it, so a model never sees a size it was not built for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dstore.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A registered model.

    Attributes:
        build: (in_channels, num_classes, input_size) -> torch.nn.Module.
        input_size: image size (H, W) of the data -> the (H, W) the model is fed.
        description: one line for `--help` and docs.
    """

    build: Callable
    input_size: Callable[[tuple[int, int]], tuple[int, int]]
    description: str


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, input_size: Callable, description: str):
    """Decorator registering a builder under `name`."""
    def deco(fn):
        if name in _REGISTRY:
            raise ConfigError(f"model name {name!r} is already registered")
        _REGISTRY[name] = ModelEntry(fn, input_size, description)
        return fn
    return deco


def model_names() -> tuple[str, ...]:
    """The registered model names."""
    return tuple(_REGISTRY)


def get_model(name: str) -> ModelEntry:
    """The registry entry for `name`.

    Raises:
        ConfigError: naming the unknown model and the known ones.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"model={name!r} is not one of {model_names()}") from None


def default_model(image_size: tuple[int, int]) -> str:
    """The model `--model auto` picks: the small CNN below 32x32, else the small ResNet."""
    return "small_cnn" if min(image_size) < 32 else "resnet_small"


def build_model(name: str, in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """Builds model `name` for images of `image_size` (already resized to its input size)."""
    if in_channels < 1 or num_classes < 2:
        raise ConfigError(f"in_channels={in_channels} must be >= 1 and num_classes={num_classes} >= 2")
    return get_model(name).build(in_channels, num_classes, tuple(image_size))


# --- models ---------------------------------------------------------------------------------------

@register_model("small_cnn", input_size=lambda hw: tuple(hw),
                description="3 conv layers + linear, no batch norm; for tiny images such as 8x8 digits")
def small_cnn(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """Conv(32)-Conv(64)-pool-Conv(64)-global pool-Linear; works at any input size >= 4x4.

    No batch norm, so a step on N ranks with the global batch split equals one step on 1 rank.
    """
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, num_classes),
    )


def _resnet(in_channels: int, num_classes: int, widths: tuple[int, ...], blocks: int):
    from torch import nn

    class Block(nn.Module):
        """Basic residual block (two 3x3 convolutions), with a 1x1 projection when the shape changes."""

        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Identity() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
              nn.ReLU(inplace=True)]
    cin = widths[0]
    for i, w in enumerate(widths):
        for b in range(blocks):
            layers.append(Block(cin, w, 2 if (b == 0 and i > 0) else 1))
            cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


@register_model("resnet_small", input_size=lambda hw: (32, 32),
                description="ResNet-8 (3 stages of 16/32/64 channels, 1 block each) at 32x32")
def resnet_small(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """A CIFAR-style ResNet-8; larger images are resized/cropped to 32x32 by the input pipeline."""
    return _resnet(in_channels, num_classes, (16, 32, 64), 1)


@register_model("resnet20", input_size=lambda hw: (32, 32),
                description="ResNet-20 (3 stages of 16/32/64 channels, 3 blocks each) at 32x32")
def resnet20(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """The CIFAR ResNet-20 of He et al.; inputs resized/cropped to 32x32."""
    return _resnet(in_channels, num_classes, (16, 32, 64), 3)
