"""The loader: a store's bytes -> uint8 tensors (torch only in `store_loader.py` and `epoch.py`).

`store_loader.py` is `StoreLoader` (it was dstore/torch.py, a name that shadowed torch);
`config.py` its arguments (`LoaderConfig`); `transform.py` what it asks of a transform (`SplitTransform`);
`epoch.py` one loader epoch; `workers.py` the decode processes (`decode_worker.py`); `decode.py`
bytes -> HWC pixels (and the optional extension `_jpegcrop`); `kernels.py` and `resize.py` the
per-sample resize; `draws.py` a sample's augmentation draws. docs/design.md, "The loader".
"""
