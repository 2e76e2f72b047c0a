"""What the loader's machinery costs a rank in memory, measured: the constants `capacity.loader_reserve`
counts in a budget, kept with memory's arithmetic (the loader imports them from here, never the reverse)."""

NATIVE_MIN_PIXELS = 64 * 64
"""Outputs of fewer pixels (H x W) take the numpy path (dstore.codec.kernels), and do not count
towards DSTORE_NATIVE_AFTER: the compiled kernels are never loaded for them."""

RESERVE_BYTES = 144 << 20
"""Memory the loaded kernels cost a rank, counted once in its budget where its loader's input has
NATIVE_MIN_PIXELS or more (`capacity.loader_reserve`): measured 141 MB more RSS in a rank that loads
them itself (decode threads: 62 MB anonymous, 78 MB numba's and LLVM's file pages), and 97 MB of
file pages its decode workers share (their own anonymous part is in WORKER_BYTES)."""

KEEP_HANDED = 4
"""Output segments the caller let go of that the decode workers keep, mapped, to be written again
(dstore.loader.workers, NOTE [decode workers] 3): counted in the rank's budget as that many batches."""

WORKER_BYTES = 128 << 20
"""A decode worker's own memory counted in the rank's budget, with a margin: measured 248 MB RSS
decoding 224px batches of 64 once its compiled kernels are loaded, of which 93 MB anonymous (20 MB
before them: numba and LLVM hold the rest), 57 MB the shared batch segments it maps (counted with
the batches) and 97 MB file pages of the interpreter and its libraries, shared by all the workers
and the rank (RESERVE_BYTES, counted once)."""
