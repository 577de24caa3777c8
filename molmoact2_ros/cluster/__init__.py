"""Scale-out on Ray: joining or starting a cluster and fanning work items out over actors.

Ray is imported here only, and only when a command is given ``--ray``.
"""
