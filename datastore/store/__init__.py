"""dstore.store: see docs/design.md, "Layers"."""
