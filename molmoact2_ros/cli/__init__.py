"""The ``molmoact2`` command: ``main`` and one module per command."""

from .app import main

__all__ = ["main"]
