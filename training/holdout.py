"""Order safety of the held-out split: the held-out set is the container's tail, which is a random
choice only if the container was written in a random order. Checked before training.

Why the tail: the store serves contiguous sample ranges (each rank's share is one sequential read,
and ownership is arithmetic on offsets), so the split is a range, and `dstore ingest` writes a
seeded random order (`ingest_order: seeded`: the tail is a seeded random choice) or, with
`--stratify`, a seeded order with every class spread evenly (`stratified`: any tail is a stratified
random choice, each class within about one sample of its share). A container written in another
order (`--keep-order`, or by hand with `create_writer`: no `ingest_order`) has a tail that may be
one class: a held-out accuracy on it would be meaningless (issue 23 saw 0.1176 reported with no
word). Such a container is refused when its tail's label shares are far from the whole's, and
warned about loudly otherwise; the remedies named are a re-ingest (`dstore ingest OLD NEW
--stratify`, which reads a container as a source), a separate held-out container (`--val`) or no
held-out set (`--holdout 0`).
"""

from __future__ import annotations

import math

import numpy as np

from dstore.errors import ConfigError

RANDOM_ORDERS = ("seeded", "stratified")
"""`ingest_order` values whose tail is a random choice."""


def label_distance(labels, held_range: tuple[int, int]) -> tuple[float, int, int]:
    """(total variation distance between the label shares of the tail and of the whole, classes in
    the tail, classes in the whole)."""
    labels = np.asarray(labels, dtype=np.int64)
    k = int(labels.max()) + 1 if labels.size else 1
    whole = np.bincount(labels, minlength=k) / max(1, labels.size)
    tail_labels = labels[held_range[0] : held_range[1]]
    tail = np.bincount(tail_labels, minlength=k) / max(1, tail_labels.size)
    return float(0.5 * np.abs(tail - whole).sum()), int((tail > 0).sum()), int((whole > 0).sum())


def tolerance(classes: int, held: int) -> float:
    """The distance above which a tail of `held` samples over `classes` classes is taken as not a
    random draw: a random draw's expected distance is about sqrt(classes / (2 pi held)) while
    classes are few against the tail; the bound, 0.2 + 0.5 sqrt(classes / held), leaves it well
    behind (digits' 359-sample tail: 0.28 against a random 0.07 and a class-ordered 0.8)."""
    return 0.2 + 0.5 * math.sqrt(classes / max(1, held))


def check_held_out(path: str, info_extra: dict, labels, held_range: tuple[int, int] | None) -> str | None:
    """None if the held-out tail of the container at `path` is a random choice (or there is none);
    a loud warning if the container's order is not random but its tail's labels look
    representative.

    Raises:
        ConfigError: the order is not random and the tail's label shares are far from the whole's
            (a class-ordered container), naming the remedies.
    """
    if held_range is None:
        return None
    order = info_extra.get("ingest_order")
    if order in RANDOM_ORDERS:
        return None
    said = f"written in {order} order" if order else "not written by dstore ingest (no ingest_order attribute)"
    held = held_range[1] - held_range[0]
    distance, tail_classes, classes = label_distance(labels, held_range)
    remedies = (
        f"re-ingest it in a seeded stratified order (dstore ingest {path} NEW.h5 --stratify), give a "
        "separate held-out container (--val), or hold nothing out (--holdout 0)"
    )
    if distance > tolerance(classes, held):
        raise ConfigError(
            f"{path} is {said}, and its tail held out for evaluation (samples {held_range[0]}.."
            f"{held_range[1] - 1}) is not a random choice: it holds {tail_classes} of the {classes} "
            f"classes, its label shares {distance:.0%} away from the whole's; its accuracy would mean "
            f"nothing. {remedies[0].upper()}{remedies[1:]}"
        )
    return (
        f"WARNING: {path} is {said}: its held-out tail ({held} samples) is not a seeded random choice, "
        f"though its labels look representative ({tail_classes} of {classes} classes, shares {distance:.0%} "
        f"from the whole's); to be sure, {remedies}"
    )
