"""Pure arithmetic of who serves which sample when: no MPI, no I/O, tested without mpiexec.

`plan.py` ownership, steps, schedules, window layouts, coalesced gets (the store's plan; `dstore
plan`, the command, is memory/capacity.py); `policy.py` the shuffle policies, one object each
(`POLICIES`), and the resume point; `shuffle.py` their epoch orders; `permute.py` the keyed
bijection behind `global`; `mix.py` the order of a mix of sources; `tiers.py` the resident set and
a step's storage reads. docs/design.md, "The store engine".
"""
