"""The trainer's input path: uint8 out of the decode threads, normalised per batch on the device.
The batch normalisation must give exactly what per-sample normalisation gave."""

import numpy as np
import pytest
import torch

from dstore.training.augment import ImageTransform


@pytest.mark.parametrize("channels", [1, 3])
def test_batch_normalisation_equals_the_per_sample_one(channels):
    rng = np.random.default_rng(3)
    mean, std = (0.41, 0.47, 0.52)[:channels], (0.21, 0.26, 0.3)[:channels]
    per_sample = ImageTransform((24, 20), channels, mean, std, train=True, pad=3, flip=True)
    deferred = ImageTransform((24, 20), channels, mean, std, train=True, pad=3, flip=True, normalize=False)
    imgs = [rng.integers(0, 256, (31, 27, channels), dtype=np.uint8) for _ in range(9)]
    want = torch.stack([per_sample(im, np.random.default_rng([7, i])) for i, im in enumerate(imgs)])
    raw = torch.stack([deferred(im, np.random.default_rng([7, i])) for i, im in enumerate(imgs)])
    assert raw.dtype == torch.uint8 and raw.shape == (9, channels, 24, 20)
    got = deferred.normalize_batch(raw)
    assert got.dtype == torch.float32
    assert torch.equal(got, want)
    assert deferred.normalize_batch(got) is got  # a float batch is already normalised


def test_the_trainer_prepares_every_batch_before_the_model():
    from mpi4py import MPI

    from dstore.training.dist import init_distributed
    from dstore.training.loop import Trainer

    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, x):
            seen.append(x.dtype)
            return self.lin(x.flatten(1))

    tf = ImageTransform((2, 2), 1, (0.5,), (0.25,), normalize=False)
    with init_distributed(MPI.COMM_SELF, "cpu") as ctx:
        model = Probe()
        trainer = Trainer(ctx, model, torch.optim.SGD(model.parameters(), lr=0.1), prepare=tf.normalize_batch)
        images = torch.randint(0, 256, (3, 1, 2, 2), dtype=torch.uint8)
        trainer.train_step(images, torch.tensor([0, 1, 0]), 3)

        class OneBatch:
            def epoch(self, e):
                yield images, torch.tensor([0, 1, 0])

        trainer.evaluate(OneBatch())
    assert seen == [torch.float32, torch.float32]


def _crop_by_padding(img, pad, rng):  # the definition: pad with zeros, crop the original size
    h, w = img.shape[:2]
    padded = np.pad(img, ((pad, pad), (pad, pad), (0, 0)))
    top, left = rng.integers(0, 2 * pad + 1, size=2)
    return padded[top : top + h, left : left + w]


@pytest.mark.parametrize("shape,pad", [((24, 20, 3), 3), ((5, 7, 1), 9), ((1, 1, 3), 1), ((32, 32, 3), 4)])
def test_random_crop_equals_padding_then_cropping(shape, pad):
    from dstore.training.augment import random_crop

    img = np.random.default_rng(1).integers(1, 256, shape, dtype=np.uint8)
    for seed in range(60):  # offsets beyond the image (pad > side) included
        want = _crop_by_padding(img, pad, np.random.default_rng(seed))
        got = random_crop(img, pad, np.random.default_rng(seed))
        assert got.shape == want.shape and np.array_equal(got, want), (seed, pad)


def test_an_untouched_read_only_sample_is_copied_not_viewed():
    img = np.arange(8 * 8, dtype=np.uint8).reshape(8, 8, 1)
    img.flags.writeable = False  # as a raw sample viewing the loader's batch bytes
    out = ImageTransform((8, 8), 1, (0.5,), (0.25,), normalize=False)(img)
    assert out.dtype == torch.uint8 and out.shape == (1, 8, 8)
    assert not np.shares_memory(out.numpy(), img) and out.numpy().flags.writeable
