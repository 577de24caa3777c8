"""Measurements: the host's critical path, the runtime designs against their floor, the
closed-loop blend bench and the soak run."""
