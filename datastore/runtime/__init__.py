"""dstore.runtime: see docs/design.md, "Layers"."""
