"""The seam between the pool (runner/pool/pool.py) and where its workers live: local processes
(runner/pool/local.py) or Ray actors (runner/pool/ray.py). A backend is three calls: start(spec)
gives a link, one life of one worker; wait(links, timeout) gives what each link said and whether
it died; close(). The pool knows workers only through these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Optional, Protocol, Sequence, TypeVar

from ...workers.spec import WorkerSpec
from ..plan.nodes import Node


class Link(Protocol):
    """One life of one worker."""

    @property
    def pid(self) -> Optional[int]:
        """Its pid on this machine while alive (psutil watches it), else None."""
        ...

    def send(self, msg: Any) -> None:
        """A message of workers/protocol.py to the worker."""
        ...

    def join(self, timeout: Optional[float] = None) -> None: ...

    def kill(self) -> None:
        """End this life now, if it has not ended, and let go of what it holds; idempotent."""
        ...

    def how_it_died(self) -> tuple[str, str]:
        """(how: "signal 9", "exit code 1"; its last words on stderr)."""
        ...


LinkT = TypeVar("LinkT", bound=Link)


@dataclass
class Event(Generic[LinkT]):
    """What one worker said since the last wait (messages of workers/protocol.py), and whether it
    has died (after saying it)."""

    link: LinkT
    messages: list[Any]
    died: bool = False


class Backend(Protocol[LinkT]):
    """Where workers live; each backend waits on its own links."""

    name: str

    def nodes(self) -> list[Node]:
        """The machines the layout is planned for."""
        ...

    def start(self, spec: WorkerSpec) -> LinkT: ...

    def wait(self, links: Sequence[LinkT], timeout: float, wake: Optional[int] = None) -> list[Event[LinkT]]:
        """What the links said, waiting up to `timeout` for the first to speak or die. `wake`: a
        file descriptor whose becoming readable also ends the wait (and is drained): the feed
        has something new (runner/pool/intake.py Feed.wake_fd)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> "Backend[LinkT]": ...

    def __exit__(self, *exc: object) -> None: ...
