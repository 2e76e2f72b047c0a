"""Ingest: read a data set once and write it as a container, split over the ranks of an MPI job.

    from dstore.ingest import ingest
    report = ingest("images/", "train.h5", on_error="skip")    # or: mpiexec -n 4 dstore ingest ...

Sources (`source_type="auto"` picks by the spec):
- an image folder root/<class>/.../<file> (torchvision ImageFolder layout): the original file bytes,
  labels from the sorted class names; encoding `jpeg`/`png` if every file name says so, else `image`
  (see dstore.ingest.folder for listing rules and validation cost);
- a flat folder or any list of files with `labels="FILE.csv"` (path,label; dstore.ingest.listed);
- WebDataset tar shards, read in place (dstore.ingest.tar; `image_key`, `label_key`);
- Parquet files or a Hugging Face `datasets` directory, via pyarrow (dstore.ingest.table;
  `image_column`, `label_column`);
- any iterable of (bytes, label, name) through `ingest_items` (dstore.ingest.items);
- CIFAR-10/100 python batches (a directory or one file), read with a restricted unpickler; raw
  uint8 (32, 32, 3) (dstore.ingest.cifar);
- a `.npz` (images + labels) or `.npy` (labels from a sidecar, else 0): raw (dstore.ingest.arrays);
- `digits`: scikit-learn's 1,797 real 8x8 digits, raw uint8 (8, 8, 1) scaled to 0..255;
- `synthetic`: seeded ImageNet-like JPEGs of about 110 KB (dstore.ingest.synthetic; the same
  images as files come from `generate_image_folder`). For it `seed` seeds the images as well.

Order: samples are written in a seeded random order (`keep_order=True`: source order), each with its
source index, so any contiguous block mixes the classes. The order does not depend on the ranks.

Parallel: with one output file every rank processes (reads, validates, converts) a share of the
samples and streams it to rank 0, which writes. With `shards=S`, ranks form min(S, ranks) groups that
write their shards in parallel and rank 0 writes the manifest (dstore.ingest.plan).

Errors: on_error="raise" stops at the first bad sample on whichever rank, with its path and reason,
on every rank, and leaves no container behind; "skip" leaves bad samples out and lists each with its
reason in `IngestReport.skipped`. Non-image files in an image folder are ignored (`report.ignored`).
"""

from dstore.ingest.items import ingest_items
from dstore.ingest.registry import open_source
from dstore.ingest.report import IngestError, IngestReport
from dstore.ingest.run import ingest
from dstore.ingest.source import SOURCE_TYPES, Source

__all__ = ["SOURCE_TYPES", "IngestError", "IngestReport", "Source", "ingest", "ingest_items", "open_source"]
