"""Checking a Ray address before ray.init, which retries an address with no Ray head behind it
for minutes (nobody listening, or another server: an HTTP server, the dashboard's port, a proxy),
printing Ray's C++ warnings meanwhile: a TCP connection, then the first bytes of gRPC (the HTTP/2
client preface, RFC 9113 3.4: a gRPC server, as Ray's GCS is, answers with its SETTINGS frame),
then Ray's own first question to a GCS, the cluster's id, each bounded by CONNECT_TIMEOUT_S; and
what `auto` resolves to, as ray.init would resolve it."""

from __future__ import annotations

import os
import socket
from typing import Optional

from ...workers.native_stderr import stderr_captured
from ..errors import ConfigError

CONNECT_TIMEOUT_S = 5.0  # each step of checking an address: connecting, the first answer, the GCS's
# A gRPC client's first bytes: the HTTP/2 connection preface and an empty SETTINGS frame (length 0,
# type 4, no flags, stream 0); a gRPC server's first frame is its own SETTINGS (RFC 9113 3.4, 6.5).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
HTTP2_SETTINGS = 4  # the frame type, the 4th byte of a frame's header
GIVE_GCS = "give the GCS address `ray start --head` prints (HOST:6379 by default), not the dashboard's or another port"


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
        from ray._private.utils import get_ray_address_file, read_ray_address  # type: ignore[attr-defined]
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
