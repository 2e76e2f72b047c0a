"""The job around every layer: launch checks and abort, agreement, signals, options, units.

`job.py` (wrong launchers refused, the aborting excepthook), `collective.py` (one rank's failure
raised on every rank), `preemption.py` (SIGTERM as a flag agreed over ranks), `heartbeat.py`,
`progress.py` (MPI progress in a thread), `rc.py` (every environment variable), `units.py` (one
grammar for sizes, rates, durations), `integrity.py` (bytes read checked against their CRC32s).
docs/design.md, "Runtime".
"""
