"""What every benchmark here reports with: one percentile, one CPU clock.

One definition keeps the figures in docs/benchmarks.md comparable across scripts; before,
each script had its own rounding of "p99".
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path


def percentile(values: Sequence[float], percent: float) -> float:
    """The ``percent`` (0-100) percentile, interpolated between the closest ranks (numpy's
    default "linear" method), so small samples still give a p99 between the top two values."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * percent / 100
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """User + system CPU time of a process and all its threads, or of one of its threads by
    id (Linux /proc): a figure the machine's load does not change, unlike latencies on a
    shared 2-core box."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
