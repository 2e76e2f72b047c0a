"""`dstore bench`: the store's throughput side by side with the hardware limits and with what users read with today.

One module per kind of measurement, each a set of functions that take an explicit `comm` and return
plain measurement records (see `common.Measurement`):

- `limits`: memcpy, raw `Win.Allocate` + `Get`, sequential file reads (cold and warm);
- `baselines`: torch DataLoader over the image folder, h5py and zarr per-sample reads;
- `layouts`: per-sample-friendly copies of the container for those reads (contiguous HDF5, small Zarr chunks);
- `mosaic`: Mosaic Streaming over MDS shards, run in its own venv (`mosaic_peer.py`);
- `store_bench`: the store's population, epoch delivery and decode through `StoreLoader`;
- `training_view`: DLIO-style accelerator utilisation with a fixed sleep as compute;
- `report`: JSON, Markdown tables, ratios against the goals, PNG plots, merging runs;
- `runner`: the whole run, in order, with the progress display.
"""
