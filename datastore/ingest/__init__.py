"""Ingest: read a data set once (image folder, CIFAR batches, NumPy arrays, digits, synthetic) and
write it as a container, split over the ranks of an MPI job.

    from datastore.ingest import ingest
    report = ingest("images/", "train.h5", shards=1, on_error="skip")
"""

from datastore.ingest.run import IngestError, IngestReport, ingest
from datastore.ingest.source import SOURCE_TYPES, Source, open_source

__all__ = ["SOURCE_TYPES", "IngestError", "IngestReport", "Source", "ingest", "open_source"]
