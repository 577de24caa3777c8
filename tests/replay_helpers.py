"""Helpers for the replay tests: observation bags from the tiny traces, the CLI in-process."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from molmoact2_ros.bundle.golden import load_npz
from molmoact2_ros.control.params import Settings

FIRST_NS = 10**9
PERIOD_NS = 5 * 10**8


def trace(tiny_root: Path, variant: str = "grid_sampler", name: str = "e2e_trace") -> dict:
    return load_npz(tiny_root / variant / "golden" / f"{name}.npz")


def obs_bag(path: Path, tr: dict, frames: int = 3, *, swap: bool = False, skip: int = 0,
            **kw) -> Path:
    """``frames`` observations of the trace, one every 0.5 s from t = 1 s (the first ``skip``
    left out); the state moves a little per frame so every chunk differs."""
    from molmoact2_ros.replay.replay import write_observation_bag

    primary, wrist = tr["image_primary"], tr["image_wrist"]
    if swap:
        primary, wrist = wrist, primary
    rows = []
    for i in range(skip, frames):
        state = np.asarray(tr["state"], np.float32) + np.float32(0.01 * i)
        rows.append((FIRST_NS + i * PERIOD_NS, primary, wrist, state))
    write_observation_bag(path, rows, Settings(), **kw)
    return path


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """``molmoact2 ARGV`` in this process: (exit status, stdout, stderr)."""
    from molmoact2_ros.cli.app import main

    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def humble_recorded(bag: Path) -> Path:
    """Turn a version-8 sqlite3 bag into what Humble's rosbag2 writes: metadata version 5
    without type hashes, custom data or distro, sqlite schema 3 without message definitions."""
    db = next(bag.glob("*.db3"))
    con = sqlite3.connect(db)
    con.execute("DROP TABLE message_definitions")
    con.execute("ALTER TABLE topics DROP COLUMN type_description_hash")
    con.execute("UPDATE schema SET schema_version = 3, ros_distro = 'humble'")
    con.commit()
    con.close()
    meta = bag / "metadata.yaml"
    lines = [ln for ln in meta.read_text().splitlines()
             if not ln.strip().startswith(("custom_data", "ros_distro", "type_description_hash",
                                           "RIHS01_"))]
    text = "\n".join(lines).replace("version: 8", "version: 5")
    assert "version: 5" in text
    meta.write_text(text + "\n")
    return bag
