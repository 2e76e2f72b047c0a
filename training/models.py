"""Models by name: a registry of builders `(in_channels, num_classes, image_size) -> nn.Module`,
and a user's own model by import path, `package.module:factory` (`--model` of `dstore train`).

The factory contract (a registered builder and a user's factory alike):

    def factory(in_channels: int, num_classes: int, image_size: tuple[int, int]) -> torch.nn.Module

* ``in_channels``: 1 (grey) or 3 (RGB), as the data hold them or `--channels` forces;
* ``num_classes``: the container's number of classes (labels are 0 .. num_classes - 1);
* ``image_size``: (H, W) of the images the model will be fed: the model's input size (below), or
  `--image-size` when given. The model returns logits of shape (batch, num_classes) for inputs of
  shape (batch, in_channels, H, W), normalised float32.

Every model states the input size it is built for: ``input_size(image_size) -> (H, W)`` maps the
data's image size to the size the model wants (a registered builder gives it to `register_model`;
a factory may carry it as an attribute, ``factory.input_size = lambda hw: (224, 224)``; without one
the model is fed the data's own size). The input pipeline resizes or crops images to it, so a
model never sees a size it was not built for.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
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
    """The registry entry for `name`, or for a user's factory named `package.module:factory`.

    Raises:
        ConfigError: naming the unknown model and the known ones, or what is wrong with the import path.
    """
    if ":" in name:
        return _imported(name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"model={name!r} is not one of {model_names()} nor package.module:factory") from None


def _imported(path: str) -> ModelEntry:
    """The entry of the factory at import path `package.module:factory` (see the module docstring)."""
    modname, _, attr = path.partition(":")
    if not modname or not attr:
        raise ConfigError(f"--model {path!r}: an import path is package.module:factory")
    try:
        module = importlib.import_module(modname)
    except ImportError as exc:
        raise ConfigError(
            f"--model {path!r}: cannot import {modname!r} ({exc}); is it on PYTHONPATH on every node?"
        ) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"--model {path!r}: module {modname!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(
            f"--model {path!r}: {attr!r} is not callable (a factory "
            "(in_channels, num_classes, image_size) -> torch.nn.Module)"
        )
    _check_signature(path, fn)
    input_size: Callable[[tuple[int, int]], tuple[int, int]] = getattr(fn, "input_size", None) or (
        lambda hw: (hw[0], hw[1])
    )
    if not callable(input_size):
        raise ConfigError(f"--model {path!r}: its input_size attribute must be a callable (H, W) -> (H, W)")
    doc = (fn.__doc__ or "").strip().splitlines()
    return ModelEntry(fn, input_size, doc[0] if doc else path)


def _check_signature(path: str, fn) -> None:
    """Refuses (ConfigError) a factory that cannot be called as fn(in_channels, num_classes, image_size)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: its call will tell
        return
    try:
        sig.bind(1, 2, (3, 3))
    except TypeError as exc:
        raise ConfigError(
            f"--model {path!r}: the factory's signature {path.partition(':')[2]}{sig} cannot be called "
            f"as factory(in_channels, num_classes, image_size) ({exc}); give it those three "
            f"parameters"
        ) from None


IMAGENET_MIN_SIDE = 128
"""Images whose shorter side is this or more, trained with the ImageNet recipe, get an ImageNet model
from `--model auto` (the random resized crop's 224 px output would upsample anything much smaller)."""


def default_model(image_size: tuple[int, int], augment: str = "auto") -> tuple[str, str]:
    """(name, why) of the model `--model auto` picks for images of `image_size` (H, W) and the
    `--augment` recipe: the small CNN below 32x32; ResNet-18 at 224x224 for photos of
    IMAGENET_MIN_SIDE px and up under the ImageNet recipe; else the small ResNet at 32x32."""
    side = min(image_size)
    if side < 32:
        return "small_cnn", f"images of {side} px are below 32 px"
    if augment == "imagenet" and side >= IMAGENET_MIN_SIDE:
        return "resnet18", f"--augment imagenet on images of {side} px (>= {IMAGENET_MIN_SIDE})"
    if side >= IMAGENET_MIN_SIDE:
        return "resnet_small", (
            f"images of {side} px, not trained with --augment imagenet: cut to 32x32 "
            f"(--augment imagenet --model auto picks resnet18 at 224x224)"
        )
    return "resnet_small", f"images of {side} px (32 to {IMAGENET_MIN_SIDE - 1})"


def build_model(name: str, in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """Builds model `name` for images of `image_size` (already resized to its input size)."""
    if in_channels < 1 or num_classes < 2:
        raise ConfigError(f"in_channels={in_channels} must be >= 1 and num_classes={num_classes} >= 2")
    try:
        model = get_model(name).build(in_channels, num_classes, tuple(image_size))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's factory may raise anything: one line naming it
        raise ConfigError(
            f"--model {name!r}: the factory raised {type(exc).__name__}: {_first_line(exc)} (called "
            f"as factory(in_channels={in_channels}, num_classes={num_classes}, "
            f"image_size={tuple(image_size)}))"
        ) from None
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ConfigError(f"model {name!r} returned a {type(model).__name__}, not a torch.nn.Module")
    check_logits(model, name, in_channels, num_classes, image_size)
    return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


def check_logits(model, name: str, in_channels: int, num_classes: int, image_size) -> None:
    """Refuses (ConfigError) a model whose output for one image is not (1, num_classes) logits.

    One forward pass in eval mode on a zero image, before any training: a model built for another
    number of classes would otherwise train against labels it cannot score (cross-entropy fails
    only for labels past its outputs, and then mid-epoch), and one of another input size fails at
    its first batch with a shape error from deep inside it.
    """
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(1, in_channels, *image_size))
    except Exception as exc:  # noqa: BLE001 - whatever the model's forward raises, named in one line
        raise ConfigError(
            f"--model {name!r}: its forward pass on one {in_channels}x{image_size[0]}x{image_size[1]} "
            f"image failed before training: {type(exc).__name__}: {_first_line(exc)}"
        ) from None
    finally:
        model.train(was_training)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if shape != (1, num_classes):
        what = f"a {type(out).__name__}" if shape is None else f"logits of shape {shape}"
        raise ConfigError(
            f"--model {name!r} returns {what} for one image; the data have {num_classes} classes, so "
            f"it must return (batch, {num_classes}) logits: build its last layer with num_classes"
        )


# --- models ---------------------------------------------------------------------------------------


@register_model(
    "small_cnn",
    input_size=lambda hw: tuple(hw),
    description="3 conv layers + linear, no batch norm; for tiny images such as 8x8 digits",
)
def small_cnn(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """Conv(32)-Conv(64)-pool-Conv(64)-global pool-Linear; works at any input size >= 4x4.

    No batch norm, so a step on N ranks with the global batch split equals one step on 1 rank.
    """
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


@functools.cache
def _basic_block():
    """The basic residual block of He et al. (two 3x3 convolutions, the first carrying the stride), with
    a 1x1 projection when the shape changes: resnet_small's and resnet18/34's (torch imported here, lazily)."""
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.skip = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            )
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    return BasicBlock


def _resnet(in_channels: int, num_classes: int, widths: tuple[int, ...], blocks: int):
    from torch import nn

    Block = _basic_block()

    layers = [nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)]
    cin = widths[0]
    for i, w in enumerate(widths):
        for b in range(blocks):
            layers.append(Block(cin, w, 2 if (b == 0 and i > 0) else 1))
            cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


@register_model(
    "resnet_small",
    input_size=lambda hw: (32, 32),
    description="ResNet-8 (3 stages of 16/32/64 channels, 1 block each) at 32x32",
)
def resnet_small(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """A CIFAR-style ResNet-8; larger images are resized/cropped to 32x32 by the input pipeline."""
    return _resnet(in_channels, num_classes, (16, 32, 64), 1)


@register_model(
    "resnet20",
    input_size=lambda hw: (32, 32),
    description="ResNet-20 (3 stages of 16/32/64 channels, 3 blocks each) at 32x32",
)
def resnet20(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """The CIFAR ResNet-20 of He et al.; inputs resized/cropped to 32x32."""
    return _resnet(in_channels, num_classes, (16, 32, 64), 3)


def _bottleneck_resnet(in_channels: int, num_classes: int, blocks: tuple[int, ...]):
    """The ImageNet ResNet of He et al. with bottleneck blocks, laid out as torchvision's (v1.5: the
    stride on the 3x3 convolution), so parameter counts and state shapes match it."""
    from torch import nn

    class Bottleneck(nn.Module):
        """1x1 reduce, 3x3 (carrying the stride), 1x1 expand (x4), with a 1x1 projection when the shape changes."""

        expansion = 4

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * self.expansion
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.skip = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            )
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    layers = [
        nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for stage, count in enumerate(blocks):
        width = 64 << stage
        for b in range(count):
            layers.append(Bottleneck(cin, width, 2 if (b == 0 and stage > 0) else 1))
            cin = width * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():  # torchvision's initialisation
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def _basic_resnet(in_channels: int, num_classes: int, blocks: tuple[int, ...]):
    """The ImageNet ResNet of He et al. with basic blocks (two 3x3 convolutions), laid out as
    torchvision's resnet18/34, so parameter counts match it."""
    from torch import nn

    Basic = _basic_block()

    layers = [
        nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for stage, count in enumerate(blocks):
        width = 64 << stage
        for b in range(count):
            layers.append(Basic(cin, width, 2 if (b == 0 and stage > 0) else 1))
            cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():  # torchvision's initialisation
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


@register_model(
    "resnet18",
    input_size=lambda hw: (224, 224),
    description="ResNet-18 (basic blocks [2, 2, 2, 2], torchvision's layout) at 224x224",
)
def resnet18(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """ResNet-18 as torchvision builds it (11,689,512 parameters for 3 channels and 1000 classes), without
    torchvision; inputs resized/cropped to 224x224 unless --image-size says otherwise."""
    return _basic_resnet(in_channels, num_classes, (2, 2, 2, 2))


@register_model(
    "resnet50",
    input_size=lambda hw: (224, 224),
    description="ResNet-50 (bottleneck blocks [3, 4, 6, 3], torchvision's layout) at 224x224",
)
def resnet50(in_channels: int, num_classes: int, image_size: tuple[int, int]):
    """ResNet-50 as torchvision builds it (25,557,032 parameters for 3 channels and 1000 classes), without
    torchvision; inputs resized/cropped to 224x224 unless --image-size says otherwise."""
    return _bottleneck_resnet(in_channels, num_classes, (3, 4, 6, 3))
