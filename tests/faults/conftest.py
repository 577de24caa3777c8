"""The fault tests' controller rig: the real controller on the tiny bundle, shut down after."""

from __future__ import annotations

import pytest
from controller_fakes import Rig


@pytest.fixture
def rig(tiny_root):
    rig = Rig(tiny_root)  # real bundle folders: reload changes pass the file checks
    yield rig
    rig.ctl.shutdown()
