"""MolmoAct2-LIBERO on the Qualcomm IQ-9075: ROS-free core of the molmoact2_ros package.

Importing this package needs numpy only; rclpy lives in ``node.py`` and qai_appbuilder in
the resident HTP workers.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .bundle.variants import COMPONENTS, VARIANTS, VariantSpec, get_variant  # noqa: E402
from .errors import (  # noqa: E402
    BundleError,
    ContractError,
    GoldenError,
    MolmoActError,
    ObservationError,
    PromptError,
    RuntimeBackendError,
    WorkerFailed,
)

__all__ = [
    "COMPONENTS",
    "VARIANTS",
    "BundleError",
    "ContractError",
    "GoldenError",
    "MolmoActError",
    "ObservationError",
    "PromptError",
    "RuntimeBackendError",
    "VariantSpec",
    "WorkerFailed",
    "__version__",
    "get_variant",
]
