"""dstore.loader: see docs/design.md, "Layers"."""
