"""Kiln's compiler: TorchScript in, verified and timed artifacts out. Knows nothing of HTTP or Redis."""
