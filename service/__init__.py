"""Kiln's service: the FastAPI app, the compile worker and the CLI."""
