"""The address-space limit (ulimit -v) a process and its children run under, as a user is told
of it: where that limit, not the machine, ran out of memory, the machine may have memory to spare."""

from __future__ import annotations

import resource
from typing import Optional


def address_space_limit() -> Optional[int]:
    """This process's RLIMIT_AS (ulimit -v) in bytes, inherited by its children; None if unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def under_address_space_limit() -> str:
    """' under the address-space limit of N MiB per process (ulimit -v): ...', or '' without one."""
    limit = address_space_limit()
    if limit is None:
        return ""
    return f" under the address-space limit of {limit >> 20} MiB per process (ulimit -v): raise or remove the limit"
