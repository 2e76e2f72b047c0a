"""The trainer: MPI-bootstrapped PyTorch DDP fed by the data store, checkpoints, LTFB."""
