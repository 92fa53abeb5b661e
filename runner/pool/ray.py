"""The Ray backend: each worker a Ray actor on a node of a cluster, behind the pool's backend
interface (start, wait, close; runner/pool/local.py is the other one).

    pool ── link.send(msg) ──▶ actor.send(seq, bytes)             (workers/ray_actor.py)
    pool ◀── wait(): ray.wait over each actor's one outstanding next_messages call

An actor reserves its worker's threads as Ray CPUs (num_cpus) on the node the plan put it on
(NodeAffinitySchedulingStrategy, not soft: its cores were planned on that node's numbers), and
pins itself there. A dead actor, however it died (its node lost, the OOM killer, ray.kill, a
llama.cpp abort), fails its outstanding call with RayActorError (or, when its node is gone and
it cannot be placed again, ActorUnschedulableError): the pool then treats it as a dead local
process (requeues, restarts, the crash budget of runner/pool/crashes.py). An actor is never
restarted by Ray itself (max_restarts 0): the pool decides, as it does for processes.

With no address, ray.init starts a Ray instance of the job's own on this machine ("local"), even
where `ray start` or RAY_ADDRESS names a cluster (ray.init(None) would join that one, and refuse
the instance's settings); `auto` joins it. An address is checked first (runner/pool/ray_address.py).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

from ...workers.protocol import Ready, decode, encode
from ...workers.ray_actor import RayWorker
from ...workers.spec import WorkerSpec
from ..child_processes import child_environment
from ..errors import ConfigError, Interrupted
from ..plan.layout import usable_cores
from ..plan.nodes import Node, nodes_from_ray
from ..words import counted
from .backend import Event
from .intake import FEED_WAIT_S
from .ray_address import check_address, resolve_auto
from .signals import SIGNALS
from .wake import drain

log = logging.getLogger("ggbatch")

POLL_S = 2.0  # how long one next_messages call waits in the actor for a first message
ACTOR_CONCURRENCY = 4  # a poll waiting, a send, and room to spare (threaded actor)
# An actor's first poll returns within POLL_S once it exists (its model loads in a thread of its
# own): one that has not after this long waits for Ray to place it, and is said to, again each
# PENDING_REPEAT_S. It is not refused: on a shared cluster, CPUs other jobs hold free up.
PENDING_NOTICE_S = 30.0
PENDING_REPEAT_S = 300.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("backend: ray needs the ray package: pip install 'ggbatch[ray]'") from None
    return ray


def connect(address: Optional[str]) -> bool:
    """Join a Ray cluster (address: HOST:PORT or auto), or start an instance of the job's own on
    this machine (None), whatever cluster runs here already. Returns whether this call started or
    joined it (and so should leave it at the end); a process already connected (a test, a
    notebook) keeps its connection."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address == "auto":
        resolved, shown = resolve_auto()
        if resolved:
            check_address(resolved, shown)
    elif address is not None:
        check_address(address)
    # No dashboard (a server of its own), and no copying of the workers' output to this terminal:
    # the coordinator owns it, and llama.cpp's log goes to Ray's worker log files.
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if address is None:
        # Workers at the coordinator's niceness, not Ray's default 15 (workers/ray_actor.py pin_process).
        options.update(num_cpus=len(usable_cores()), _system_config={"worker_niceness": 0})
    try:
        with signals_kept(), child_environment():  # a local instance's processes start with it
            ray.init(address=address or "local", **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"ray_address {address}" if address else "backend ray: a Ray instance of the job's own"
        raise ConfigError(f"{where}: {str(exc).splitlines()[0]}") from None
    except SystemExit:
        # Ray's SIGTERM handlers, in place while ray.init runs, end it with sys.exit (15, or 1
        # once its node has killed its own processes): a stop like any SIGTERM's (exit 143), with
        # what ray.init had started ended first.
        ray.shutdown()
        raise Interrupted(signal.SIGTERM) from None
    return True


@contextmanager
def signals_kept() -> Iterator[None]:
    """ray.init puts in SIGTERM handlers of its own (sys.exit(15), and its node's: end its
    processes, sys.exit(1)), and its core worker Ray's C++ stack dump, over the one a run holds
    (runner/pool/signals.py: exit 143, every answer so far written); it has no option not to.
    Its Python ones go through ray._private.utils.set_sigterm_handler, which does nothing here
    while ray.init runs: a SystemExit raised inside it, with its core worker half made, crashed the
    process at its exit (134, or 139 without the C++ handler). The handlers held before it are put
    back after it (the C++ one in their place)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread holds them
        yield
        return
    held = {s: signal.getsignal(s) for s in SIGNALS}
    utils = _ray_utils()
    setter = getattr(utils, "set_sigterm_handler", None)
    if setter is not None:
        utils.set_sigterm_handler = _kept
    try:
        yield
    finally:
        if setter is not None:
            utils.set_sigterm_handler = setter
        for s, handler in held.items():
            if handler is not None:  # None: a handler not set from Python, which it cannot put back
                signal.signal(s, handler)


def _kept(handler: Any) -> None:
    """ray._private.utils.set_sigterm_handler while ray.init runs: the run's handler stays."""


def _ray_utils() -> Any:
    try:
        import ray._private.utils as utils
    except ImportError:
        return None
    return utils


class RayLink:
    """One life of one worker: a Ray actor."""

    def __init__(self, actor_class: Any, spec: WorkerSpec) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.spec = spec
        self.local = spec.node_ip == ray.util.get_node_ip_address()
        self.pid: Optional[int] = None  # on this machine, once ready: psutil can watch it
        if spec.node_id is None:
            raise ValueError(f"worker {spec.worker_id}: a Ray worker's spec names its node")
        strategy = NodeAffinitySchedulingStrategy(spec.node_id, soft=False)
        # Named, so an operator (or a test) can find and ray.kill one: ggbatch-worker-ID-LIFE.
        self.actor = actor_class.options(num_cpus=len(spec.cores), max_concurrency=ACTOR_CONCURRENCY,
                                         max_restarts=0, scheduling_strategy=strategy,
                                         name=f"ggbatch-worker-{spec.worker_id}-{uuid.uuid4().hex[:8]}"
                                         ).remote(spec, os.getpriority(os.PRIO_PROCESS, 0))
        self._seq = 0
        self._sends: list[Any] = []  # refs of sends not yet seen through, so no error goes unread
        self.poll = self.actor.next_messages.remote(POLL_S)
        self.exit: Optional[int] = None
        self.error = ""
        self.placed = False  # a poll has returned: Ray has placed it
        self._made = time.monotonic()
        self._said_waiting = 0

    def waiting_notice_due(self, now: float) -> bool:
        """Whether to say (again) that this actor waits for Ray to place it."""
        due = self._made + PENDING_NOTICE_S + self._said_waiting * PENDING_REPEAT_S
        return not (self.placed or self.ended) and now >= due

    def said_waiting(self) -> None:
        """The waiting notice was given: the next is due PENDING_REPEAT_S later."""
        self._said_waiting += 1

    def send(self, msg: Any) -> None:
        if self.exit is None and not self.error:
            self._sends.append(self.actor.send.remote(self._seq, encode(msg)))
            self._seq += 1

    def take(self) -> list[Any]:
        """The ready poll's messages, and a new poll unless the worker has ended."""
        import ray

        self._forget_sent()
        self.placed = True
        try:
            data, self.exit = ray.get(self.poll)
        except ray.exceptions.RayError as exc:
            # RayActorError (it died: node lost, OOM, ray.kill, an abort; or unreachable), and the
            # others that mean the same for us: ActorUnschedulableError (its node is gone, so it
            # cannot be placed again), OutOfMemoryError, a RayTaskError from inside the call.
            self.error, data = _why(exc), []
        messages = [decode(d) for d in data]
        for msg in messages:
            if isinstance(msg, Ready) and self.local:
                self.pid = msg.pid
        if self.ended:
            self.pid = None
        else:
            self.poll = self.actor.next_messages.remote(POLL_S)
        return messages

    @property
    def ended(self) -> bool:
        return self.exit is not None or bool(self.error)

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait for the worker to end (after a Stop), dropping what it says meanwhile."""
        import ray

        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        while not self.ended and time.monotonic() < deadline:
            if ray.wait([self.poll], timeout=max(0.0, deadline - time.monotonic()))[0]:
                self.take()

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # gone already (its node lost); nothing left to free
            pass
        self.pid = None

    def how_it_died(self) -> tuple[str, str]:
        return (f"exit code {self.exit}", "") if self.exit is not None else ("Ray actor died", self.error)

    def _forget_sent(self) -> None:
        import ray

        if self._sends:
            done, self._sends = ray.wait(self._sends, num_returns=len(self._sends), timeout=0)
            for ref in done:  # a failed send means a dead actor, which its poll reports
                try:
                    ray.get(ref)
                except ray.exceptions.RayError:
                    pass


def _why(exc: Exception) -> str:
    """RayActorError's own account, without its tab-indented table of ids."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("\t")]
    return " ".join(lines)[:300]


def _say_waiting(links: Sequence[RayLink]) -> None:
    """A warning for each actor Ray has not placed: what it needs where, and what is free there."""
    if not links:
        return
    free = _free_cpus()
    for link in links:
        link.said_waiting()
        spec = link.spec
        needs = counted(len(spec.cores), "CPU")
        log.warning("worker %d waits for Ray to place it: it needs %s on node %s, %s (other jobs hold the rest: "
                    "`ray status` shows them); it starts once they are free",
                    spec.worker_id, needs, spec.node_ip, free(spec.node_id or ""))


def _free_cpus() -> Callable[[str], str]:
    """What a node has free, said as "which has F of its T CPUs free", from Ray's per-node figures (a
    developer API: a Ray without it gives the whole cluster's, said so)."""
    import ray

    try:
        from ray._private.state import available_resources_per_node, total_resources_per_node

        free, total = available_resources_per_node(), total_resources_per_node()
    except (ImportError, AttributeError):
        cluster = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0)
        return lambda node_id: "and the cluster has %g of its %g CPUs free" % cluster
    return lambda node_id: (f"which has {free.get(node_id, {}).get('CPU', 0):g} of its "
                            f"{total.get(node_id, {}).get('CPU', 0):g} CPUs free")


class RayBackend:
    """Workers as Ray actors. address: HOST:PORT or auto to join a cluster, None to start one here."""

    name = "ray"

    def __init__(self, address: Optional[str]) -> None:
        self._owns = connect(address)
        import ray

        self._actor_class = ray.remote(RayWorker)

    def nodes(self) -> list[Node]:
        import ray

        nodes = nodes_from_ray(ray.nodes())
        if not nodes:
            raise ConfigError("backend ray: the cluster has no live node with CPUs")
        return nodes

    def start(self, spec: WorkerSpec) -> RayLink:
        return RayLink(self._actor_class, spec)

    def wait(self, links: Sequence[RayLink], timeout: float, wake: Optional[int] = None) -> list[Event[RayLink]]:
        import ray

        if wake is not None:  # ray.wait cannot watch a file descriptor: look at it every FEED_WAIT_S
            drain(wake)
            timeout = min(timeout, FEED_WAIT_S)
        by_ref = {link.poll: link for link in links if not link.ended}
        if not by_ref:
            time.sleep(timeout)
            return []
        refs = list(by_ref)
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:  # and every other call that is ready too
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        events: list[Event[RayLink]] = []
        for ref in ready:
            link = by_ref[ref]
            events.append(Event(link, link.take(), link.ended))
        now = time.monotonic()
        _say_waiting([link for link in links if link.waiting_notice_due(now)])
        return events

    def close(self) -> None:
        import ray

        if self._owns and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "RayBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
