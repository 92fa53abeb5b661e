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
the instance's settings); `auto` joins it. An address is checked before ray.init, which retries an
address with no Ray head behind it for minutes (nobody listening, or another server: an HTTP
server, the dashboard's port, a proxy), printing Ray's C++ warnings meanwhile: a TCP connection,
then the first bytes of gRPC (the HTTP/2 client preface, RFC 9113 3.4: a gRPC server, as Ray's GCS
is, answers with its SETTINGS frame), then Ray's own first question to a GCS, the cluster's id,
each bounded by CONNECT_TIMEOUT_S.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

from ...workers.native_stderr import stderr_captured
from ...workers.protocol import Ready, decode, encode
from ...workers.ray_actor import RayWorker
from ...workers.spec import WorkerSpec
from ..errors import ConfigError
from ..plan.layout import usable_cores
from ..plan.nodes import Node, nodes_from_ray
from .backend import Event
from .intake import FEED_WAIT_S
from .signals import SIGNALS
from .wake import drain

log = logging.getLogger("ggbatch")

POLL_S = 2.0  # how long one next_messages call waits in the actor for a first message
ACTOR_CONCURRENCY = 4  # a poll waiting, a send, and room to spare (threaded actor)
CONNECT_TIMEOUT_S = 5.0  # each step of checking an address: connecting, the first answer, the GCS's
# A gRPC client's first bytes: the HTTP/2 connection preface and an empty SETTINGS frame (length 0,
# type 4, no flags, stream 0); a gRPC server's first frame is its own SETTINGS (RFC 9113 3.4, 6.5).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
HTTP2_SETTINGS = 4  # the frame type, the 4th byte of a frame's header
GIVE_GCS = "give the GCS address `ray start --head` prints (HOST:6379 by default), not the dashboard's or another port"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("backend: ray needs the ray package: pip install 'ggbatch[ray]'") from None
    return ray


def check_address(address: str, shown: Optional[str] = None) -> None:
    """One line and exit 2 for an address with no Ray head behind it, in seconds, not minutes.
    shown: how the messages name it (what `auto` resolved to, and where from); None: the address."""
    host_port = _host_port(address)
    if host_port is None:
        if shown is not None:  # auto's, which the user did give: the value it found is at fault
            raise ConfigError(f"ray_address {shown}: not {HOST_PORT}")
        raise ConfigError(f"ray_address: must be auto or {HOST_PORT}, got {address!r}")
    where = f"ray_address {shown or address}"
    first = _first_answer(where, *host_port)
    if len(first) < 4 or first[3] != HTTP2_SETTINGS:
        raise ConfigError(f"{where}: {_what_answered(first)}, not a Ray head; {GIVE_GCS}")
    _check_gcs(address, where, token_taken=shown is not None)


HOST_PORT = "HOST:PORT (a Ray head's GCS address, as `ray start --head` prints it)"


NO_CLUSTER = ("ray_address auto: no Ray cluster to join: none runs on this machine and RAY_ADDRESS names none; "
              "start one (`ray start --head`), give ray_address (--ray-address) as HOST:PORT, or leave it out "
              "for a Ray instance of the job's own")


def resolve_auto() -> tuple[str, str]:
    """What `auto` joins, as ray.init resolves it (Ray's own helper: RAY_ADDRESS; else the one Ray
    cluster running on this machine; else the address file the last `ray start` here wrote, which
    also picks among several running here), and how to name it in a message. A Ray without that
    helper gives ("", ""): ray.init alone resolves it."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
        from ray._private.utils import get_ray_address_file, read_ray_address
    except ImportError:
        return "", ""
    given = os.environ.get("RAY_ADDRESS", "")
    if given not in ("", "auto", "local"):  # Ray's own words would name neither it nor its fault
        _check_env_address(given)
    try:
        address = canonicalize_bootstrap_address("auto")
    except ConnectionError:  # Ray's words name its own `--address` flag, which ggbatch has not
        raise ConfigError(NO_CLUSTER) from None
    except ValueError as exc:
        raise ConfigError(f"ray_address auto: {str(exc).splitlines()[0]}") from None
    if not address:
        return "", ""
    # named as the user set it: Ray's helper turns a loopback host into this machine's address
    written = (read_ray_address(None) or "").strip()
    source = (f"RAY_ADDRESS={given}" if given not in ("", "auto") else
              f"{get_ray_address_file(None)}, which holds {written}" if _canonical(written) == address
              else "the Ray cluster running here")
    return address, f"auto ({source}{'' if source.endswith(address) else f', which Ray resolves to {address}'})"


def _check_env_address(given: str) -> None:
    """ConfigError for a RAY_ADDRESS that `auto` cannot join, naming it."""
    if given.startswith("ray://"):
        raise ConfigError(f"ray_address auto: RAY_ADDRESS {given!r} is a Ray Client (ray://) address, which ggbatch "
                          f"does not join: set RAY_ADDRESS to the head's {HOST_PORT}, or unset it")
    if _host_port(given) is None:
        raise ConfigError(f"ray_address auto: RAY_ADDRESS {given!r} is not {HOST_PORT}")


def _host_port(address: str) -> Optional[tuple[str, int]]:
    """(host, port) of a HOST:PORT address; None for anything else."""
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def _canonical(address: Optional[str]) -> Optional[str]:
    """An address as Ray's helper writes it (its host resolved); None for none, or one it refuses."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address) if address else None
    except ValueError:
        return None


def _first_answer(where: str, host: str, port: int) -> bytes:
    """What the server there sends first to a gRPC client's greeting (b"": nothing in time)."""
    try:
        conn = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot connect ({exc.strerror or exc}); is a Ray head "
                          "running there (`ray start --head`)?") from None
    with conn:
        try:
            conn.sendall(HTTP2_PREFACE + HTTP2_EMPTY_SETTINGS)
            return conn.recv(64)
        except OSError:  # silent until the timeout, or the connection reset
            return b""


def _what_answered(first: bytes) -> str:
    if not first:
        return f"something accepts connections there but answers nothing to gRPC within {CONNECT_TIMEOUT_S:g} s"
    line = first.decode("latin-1").splitlines()[0] if first.strip() else ""
    said = "".join(c for c in line if c.isprintable())[:60]
    return f"another server answers there ({said!r})" if said else "another server answers there"


def _check_gcs(address: str, where: str, token_taken: bool = False) -> None:
    """A gRPC server that is not Ray's GCS fails Ray's first question to one: the cluster's id.
    Asked through Ray's C++ GCS client (not a public API: a Ray without it skips this check),
    whose warning line on failure says what its exception says, so it is taken aside. A GCS that
    wants a token (Ray's token authentication) this process does not give would refuse ray.init
    too, after its retries: ray.init takes the token for an address only with RAY_AUTH_MODE=token
    (token_taken: `auto`, for which it takes the token by itself)."""
    import ray._raylet
    from ray.exceptions import AuthenticationError, RayError

    standalone = getattr(getattr(ray._raylet, "InnerGcsClient", None), "standalone", None)
    if standalone is None:
        return
    with stderr_captured():
        try:
            standalone(address, None, int(CONNECT_TIMEOUT_S * 1000))
        except AuthenticationError:
            if token_taken:
                return
            raise ConfigError(f"{where}: the Ray head there wants its token (Ray's token "
                              "authentication): run with RAY_AUTH_MODE=token, the cluster's token in "
                              "~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH") from None
        except RayError as exc:
            raise ConfigError(f"{where}: a gRPC server answers there, but not a Ray head's GCS "
                              f"({_rpc_error(exc)}); {GIVE_GCS}") from None


def _rpc_error(exc: Exception) -> str:
    """Ray's RpcError in a few words: its message, or where a server gave none, its gRPC status."""
    said = (str(exc).strip().splitlines() or [""])[0].rstrip(": ")
    if said not in ("", "RPC error"):
        return said
    code = getattr(exc, "rpc_code", None)
    if code == 12:  # gRPC's UNIMPLEMENTED: a gRPC server of other services (a raylet, an agent)
        return "it has no GCS service: gRPC status 12, UNIMPLEMENTED"
    return f"RPC error, gRPC status {code}"


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
        with signals_kept():
            ray.init(address=address or "local", **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"ray_address {address}" if address else "backend ray: a Ray instance of the job's own"
        raise ConfigError(f"{where}: {str(exc).splitlines()[0]}") from None
    return True


@contextmanager
def signals_kept() -> Iterator[None]:
    """ray.init puts in a SIGTERM handler of its own (sys.exit(15)), and its core worker Ray's C++
    stack dump, over the one a run holds (runner/pool/signals.py: exit 143, every answer so far
    written); it has no option not to, so the handlers held before it are put back after it."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread holds them
        yield
        return
    held = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in held.items():
            if handler is not None:  # None: a handler not set from Python, which it cannot put back
                signal.signal(s, handler)


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

    def send(self, msg: Any) -> None:
        if self.exit is None and not self.error:
            self._sends.append(self.actor.send.remote(self._seq, encode(msg)))
            self._seq += 1

    def take(self) -> list[Any]:
        """The ready poll's messages, and a new poll unless the worker has ended."""
        import ray

        self._forget_sent()
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
        return events

    def close(self) -> None:
        import ray

        if self._owns and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "RayBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
