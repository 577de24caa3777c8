"""``--ray [ADDRESS]`` and the actor options, shared by the commands that fan out over Ray."""

from __future__ import annotations

import argparse

from .args import float_in, int_at_least


def add_ray_args(p: argparse.ArgumentParser, *, what: str, memory_gb: float = 0.0,
                 default_timeout: str = "") -> None:
    """The Ray options of a command whose work items are ``what`` (bags, episodes); the
    per-item deadline's default is described by ``default_timeout``."""
    g = p.add_argument_group("Ray (pip install -e '.[cluster]')")
    g.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help=f"run the {what} on Ray actors: alone or 'local' starts a local cluster "
                   "sized to this machine; HOST:PORT, ray://HOST:PORT or 'auto' joins one "
                   "(`ray start --head` prints its address)")
    g.add_argument("--ray-actors", type=int_at_least(1),
                   help="actors to start (default: as many as the cluster's resources hold)")
    g.add_argument("--ray-cpus", type=float_in(0.0, 1024.0, low_open=True), default=1.0,
                   help="CPUs each actor declares")
    g.add_argument("--ray-memory-gb", type=float_in(0.0, 4096.0), default=memory_gb,
                   help="memory each actor declares, GiB (0: none declared)")
    g.add_argument("--ray-gpus", type=float_in(0.0, 64.0), default=0.0,
                   help="GPUs each actor declares (e.g. 1 for MUJOCO_GL=egl rendering)")
    g.add_argument("--ray-retries", type=int_at_least(0), default=1,
                   help=f"times one of the {what} is re-run when its actor dies or it passes "
                   "its deadline")
    g.add_argument("--item-timeout-s", type=float_in(1.0, 7 * 86400.0), default=None,
                   help=f"seconds one of the {what} may take on its actor before the actor is "
                   "killed and it is re-run (--ray-retries) or reported as an error; default: "
                   f"{default_timeout or 'none'}")


def fix_ray_address(args: argparse.Namespace, positional: str) -> None:
    """``--ray BAG`` parses BAG as the address: a word that is no address goes back to the
    front of the positional list ``positional`` and ``--ray`` means local."""
    from ..cluster.connect import LOCAL, check_address, is_address

    if args.ray is not None and not is_address(args.ray):
        getattr(args, positional).insert(0, args.ray)
        args.ray = LOCAL
    check_address(args.ray)  # before any work: a port that is not one


def resources(args: argparse.Namespace):
    """The ``Resources`` each actor declares, from the options."""
    from ..cluster.fanout import Resources

    return Resources(num_cpus=args.ray_cpus, memory_bytes=int(args.ray_memory_gb * 2**30),
                     num_gpus=args.ray_gpus)


def item_timeouts(args: argparse.Namespace, sizes: dict[str, float], base_s: float,
                  per_unit_s: float) -> dict[str, float]:
    """Each item's deadline: ``--item-timeout-s``, or ``base_s`` plus ``per_unit_s`` per unit
    of its size (``sizes``: key to MiB of bag, steps of episode)."""
    if args.item_timeout_s is not None:
        return {key: float(args.item_timeout_s) for key in sizes}
    return {key: base_s + per_unit_s * max(float(size), 0.0) for key, size in sizes.items()}
