"""``python -m molmoact2_ros.cli``: the ``molmoact2`` command without its console script."""

import sys

from .app import main

sys.exit(main())
