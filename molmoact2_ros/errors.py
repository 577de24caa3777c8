"""Typed errors: each message names the offending thing and how to fix it."""

from __future__ import annotations


class MolmoActError(Exception):
    """Base class of every error this package raises on purpose."""


class ContractError(MolmoActError):
    """Sessions, tensors or variants that do not fit together."""


class BundleError(MolmoActError):
    """A bundle file is missing, truncated or malformed."""


class ObservationError(MolmoActError):
    """An observation (image, state, stamp) cannot be used."""


class PromptError(MolmoActError):
    """An instruction cannot be turned into a prompt for this variant."""


class GoldenError(MolmoActError):
    """A golden file does not hold what parity needs."""


class BagError(MolmoActError):
    """A rosbag2 input or output cannot be used (missing, not a bag, truncated, wrong topics)."""


class RuntimeBackendError(MolmoActError):
    """A runtime backend failed to load or run a session."""


class WorkerFailed(RuntimeBackendError):
    """A resident worker died, hung or reported an error."""

    def __init__(self, message: str, *, worker: str = "", session: str = "") -> None:
        super().__init__(message)
        self.worker = worker
        self.session = session


class MissingDependencyError(MolmoActError):
    """An optional Python package is not installed; the message names the extra to install."""
