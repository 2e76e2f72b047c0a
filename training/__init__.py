"""The trainer: MPI-bootstrapped torch.distributed, models, input pipeline, loop, checkpoints."""
