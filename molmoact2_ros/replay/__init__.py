"""Rosbag2 replay through the controller, golden chunk bags, matching by stamp, reports."""
