"""How much fits: a rank's budget, the node's limits, `dstore plan`'s forecast, the page cache.

`budget.py` checks a store's needs against every rank's budget (one allgather) and picks the
resident set; `limits.py` the default budget from the node's memory and cgroup, and the budget's
error text; `capacity.py` the same arithmetic as a forecast for `dstore plan`; `costs.py` what
the loader's machinery costs (measured constants); `pagecache.py` drops a container's pages (cold
measurements). docs/design.md, "The store engine".
"""
