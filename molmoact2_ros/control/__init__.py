"""ROS-free node logic: parameters, settings and swaps, sync, stamps, triggers, execution
(chunk timing and blending), output safety and diagnostics data."""
