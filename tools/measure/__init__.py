"""Measurement programs behind the figures in docs/ (each `python -m dstore.tools.measure.NAME --help`):
checksum, imports, loader, population, progress, reencode, scale, soak, tiers, ltfb_experiment. Not part of the
`dstore` command."""
