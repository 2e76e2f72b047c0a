"""dstore.memory: see docs/design.md, "Layers"."""
