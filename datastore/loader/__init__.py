"""The loader: a store's bytes -> uint8 tensors (torch only in `store_loader.py`, `epoch.py` and `pipeline.py`).

`store_loader.py` is `StoreLoader` (it was dstore/torch.py, a name that shadowed torch);
`config.py` its arguments (`LoaderConfig`); `transform.py` what it asks of a transform (`SplitTransform`);
`pipeline.py` its settings as a value and its decode machinery; `epoch.py` one loader epoch;
`workers.py` the decode processes (`decode_worker.py`); `antialias.py` torchvision's antialiased
resize; `draws.py` a sample's augmentation draws. The pixels themselves come from dstore.codec (the
layer below). docs/design.md, "The loader".
"""
