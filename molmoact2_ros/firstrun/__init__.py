"""First contact with a machine and a bundle: doctor's checks and the device report.

``machine`` and ``doctor`` check this machine and a bundle for the HTP runtime, one line per
check with its fix; ``facts``, ``sections``, ``seed``, ``latency``, ``report`` and ``markdown``
build the device report (platform facts, per suffix choice the load, parity and latency, the
A/B table, the Markdown and JSON files). ``cli/doctor.py`` and ``cli/device_report.py`` only
parse arguments and print.
"""
