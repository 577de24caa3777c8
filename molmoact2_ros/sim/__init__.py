"""Closed-loop evaluation in a simulator (LIBERO), ROS-free: the env on its own thread
(``libero_env``), chunk rows played by their stamps (``executor``), the episode runner over the
node's controller (``runner``), the results ledger (``ledger``), summaries (``summary``) and
videos (``video``). Importing this package needs numpy only; LIBERO loads on first use."""
