"""dstore.order: see docs/design.md, "Layers"."""
