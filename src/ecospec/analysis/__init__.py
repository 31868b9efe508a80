"""Models of cost and routing built from result records and model configs (no model weights needed)."""
