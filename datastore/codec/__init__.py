"""The image codec, below ingest, verify and the loader: bytes -> HWC uint8 pixels and the one resize.

`decode.py` decodes a sample (simplejpeg for JPEG at a DCT scale, Pillow for the rest, raw as a view;
`decode_crop` with the optional C extension `_jpegcrop`, libjpeg-turbo's partial decode); `resize.py`
the fixed-point bilinear resize (numpy per sample, torch per batch); `kernels.py` its compiled form
(numba: resize, crop, flip and CHW copy in one pass). It imports only errors, runtime.rc and
memory.costs. docs/design.md, "The loader".
"""
