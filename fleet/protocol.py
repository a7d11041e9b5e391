"""Every message between agents and the control plane, in one place (docs/architecture.md,
"Agent protocol"). JSON objects over the websocket, each with ``type`` and ``v`` (the version).

Both ends import this module; it imports nothing from Django.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from typing import Any, Literal, NotRequired, TypedDict

PROTOCOL_VERSION = 1


class GpuInfo(TypedDict):
    """One GPU of an agent's inventory. The memory figures (MiB) are left out when the
    driver refused to read them (an older control plane then stores 0, a newer one keeps
    the last known figures)."""

    index: int
    uuid: str
    name: str
    memory_total_mib: NotRequired[int]
    memory_used_mib: NotRequired[int]
    #: The last reading's compute utilisation (percent, 0-100) and temperature (°C); None or
    #: absent when unknown (simulated GPUs, a driver that refused, an older agent).
    utilisation_pct: NotRequired[float | None]
    temperature_c: NotRequired[float | None]


class GpuReading(TypedDict, total=False):
    """One GPU's fresh reading on a heartbeat (``Heartbeat.gpus``), found by its ``index`` in
    the agent's inventory. Every figure may be None (the driver refused that one reading)."""

    index: int
    memory_used_mib: int | None
    memory_total_mib: int | None
    utilisation_pct: float | None
    temperature_c: float | None


class Inventory(TypedDict):
    gpus: list[GpuInfo]
    cpu_cores: int
    memory_mib: int


class ReplicaReport(TypedDict, total=False):
    """What an agent knows about one replica it runs."""

    replica_id: int
    state: str  # a ReplicaState value the agent may report: downloading/starting/ready/failed/stopped
    pid: int | None
    port: int | None
    error: str
    #: Engine load from its metrics endpoint; None means unknown (never 0 by default).
    running: int | None
    waiting: int | None
    #: While ``downloading``: the fraction (0..1) of its weights fetched; None when unknown
    #: or not downloading. Optional: older agents do not send it.
    progress: float | None
    #: Tokens of context the replica's weights' own metadata gives (a GGUF header), once
    #: they are local; absent or None when unknown. Optional: older agents do not send it.
    weights_context_length: int | None


class Hello(TypedDict):
    type: Literal["hello"]
    v: int
    name: str
    version: str
    address: str
    inventory: Inventory
    replicas: list[ReplicaReport]


class Status(TypedDict):
    type: Literal["status"]
    v: int
    replicas: list[ReplicaReport]
    inventory: Inventory


#: One replica's load on a heartbeat: ``[replica_id, running, waiting]``, each count None
#: when the engine's metrics did not give it (docs/architecture.md, "Agent protocol").
ReplicaLoad = list  # [int, int | None, int | None]: JSON has no tuples


class Heartbeat(TypedDict):
    """Sent every ``--heartbeat-s`` when there is no status to send. ``loads``: the load of
    every ready replica as the agent last read it from the engine's metrics, a replica whose
    load is unknown left out (docs/architecture.md, R7: staleness means silence, not a
    steady engine). Optional both ways: an agent from before it sends a bare heartbeat, and
    a control plane from before it ignores the field (``check_message`` reads only ``type``
    and ``v``)."""

    type: Literal["heartbeat"]
    v: int
    loads: NotRequired[list[ReplicaLoad]]
    #: Every GPU's reading, sent every ``gpu_readings_s`` (not on every heartbeat): the
    #: control plane keeps the last on ``Gpu`` and samples them for charts
    #: (docs/architecture.md, "Agent protocol": heartbeat). Optional both ways, like ``loads``.
    gpus: NotRequired[list[GpuReading]]


class AssignedReplica(TypedDict, total=False):
    """One replica the agent must run. The agent renders ``command`` with its own port.

    ``api_key`` is the replica's engine key: the agent starts the engine with it (the
    ``{api_key}`` placeholder, in the command or the profile's env) and sends it on its
    readiness and metrics probes; only the gateway sends it otherwise. Optional on the
    wire: a control plane from before it sends none (the engine then runs unprotected).
    """

    replica_id: int
    served_name: str
    weights: str
    command: str
    env: dict[str, str]
    gpu_indices: list[int]
    cpu_cores: float
    readiness_path: str
    startup_timeout_s: int
    metrics_path: str
    metric_running: str
    metric_waiting: str
    api_key: str


class Assign(TypedDict):
    """The full desired set for one agent: run these, stop anything else (idempotent)."""

    type: Literal["assign"]
    v: int
    generation: int
    replicas: list[AssignedReplica]


class RestartAgent(TypedDict):
    type: Literal["restart_agent"]
    v: int


class ProtocolError(ValueError):
    """A message that is not JSON of a known type and version."""


AGENT_MESSAGES = frozenset({"hello", "status", "heartbeat"})
SERVER_MESSAGES = frozenset({"assign", "restart_agent"})


def check_message(message: Any, allowed: frozenset[str]) -> dict:
    """Return ``message`` if it is a dict of an allowed ``type`` and this protocol version,
    else raise ProtocolError with the reason."""
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object")
    kind = message.get("type")
    if kind not in allowed:
        raise ProtocolError(f"unknown message type {kind!r}")
    if message.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {message.get('v')!r} not supported (this end speaks {PROTOCOL_VERSION})"
        )
    return message


#: Longest agent name, version string and advertised address accepted (characters).
MAX_NAME_LEN = 128
MAX_VERSION_LEN = 64
MAX_ADDRESS_LEN = 253  # the longest DNS name
#: Most GPUs and replica reports one message may carry.
MAX_GPUS = 1024
MAX_REPLICA_REPORTS = 10_000

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_HEX_LABEL = re.compile(r"^0x[0-9a-f]*$", re.IGNORECASE)
#: Names that resolve to loopback on common systems (/etc/hosts), besides ``*.localhost``.
_LOOPBACK_NAMES = frozenset({"localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def _numeric_ipv4(name: str) -> bool:
    """Whether a resolver reads ``name`` as an IPv4 address although it is not a dotted
    quad: ``0x7f000001``, ``0x7f.0x1``, ``127.0.0.0x1`` (glibc's ``inet_aton`` forms, which
    ``getaddrinfo`` accepts), or a last label that is a number or ``0x…`` (WHATWG URLs)."""
    last = name.rsplit(".", 1)[-1]
    if last.isdigit() or _HEX_LABEL.match(last):
        return True
    try:
        socket.inet_aton(name)
    except (OSError, ValueError):
        return False
    return True


#: A log line that says what went wrong, as engines write them (Python exceptions, CUDA,
#: llama.cpp's and uvicorn's own words).
_TROUBLE = re.compile(r"\b(?:errors?|exception|traceback|fatal|failed|out of memory|address already in use|"
                      r"permission denied|no such file|not found|killed)\b", re.IGNORECASE)

#: A process that died of a signal, as the shell or the C runtime says it ("Segmentation
#: fault (core dumped)", "Illegal instruction", "Aborted"): the end of the story.
_CRASH = re.compile(r"\b(?:Segmentation fault|core dumped|Illegal instruction|Bus error|Floating point exception|"
                    r"Aborted|SIG(?:SEGV|ABRT|ILL|BUS|FPE|KILL))\b")

#: pydantic's summary line: the reason is on the lines after it.
_VALIDATION_SUMMARY = re.compile(r"\d+ validation errors? for \S+$")


#: An access-log line ('127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 500 Internal
#: Server Error'): a request's outcome, never the engine's own trouble.
_ACCESS_LOG = re.compile(r'"[A-Z]+ \S+ HTTP/\d(?:\.\d)?"\s+\d{3}')

#: The port was taken (uvicorn's "[Errno 98] ... address already in use", llama-server's
#: "couldn't bind HTTP server socket"): the most useful line a log can hold.
_PORT_TAKEN = re.compile(r"address already in use|EADDRINUSE|could(?:n'?t| not) bind (?:the |an? )?(?:HTTP )?(?:server )?"
                         r"(?:socket|port|address|to)|failed to bind (?:to )?(?:the |an? )?(?:port|address|socket|"
                         r"(?:\S+:)?\d{2,5}\b)", re.IGNORECASE)

#: The exception line that ends a Python traceback, after any log prefix ("ERROR 12-04 10:00:00
#: [core.py:1] "): "RuntimeError: CUDA out of memory", "torch.OutOfMemoryError: ...", or a bare
#: "AssertionError". A code line ("raise ValueError(...)", "except OSError:") does not match.
_EXCEPTION = re.compile(r"(?:^|[\s\]|)>])((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Fault))(?:: (\S.*)|\s*)$")

#: Exceptions that say nothing about the engine's trouble, or point elsewhere (vLLM's API
#: server ends with "RuntimeError: Engine core initialization failed. See root cause above.").
_NOT_THE_CAUSE = re.compile(r"see (?:the )?(?:root cause|error|logs?|above)|^(?:SystemExit|KeyboardInterrupt|"
                            r"(?:asyncio\.(?:exceptions\.)?)?CancelledError)\b", re.IGNORECASE)

#: A line logged at error level: "ERROR ...", uvicorn's "ERROR:    ...", "CRITICAL", "FATAL",
#: or llama.cpp's and argparse's "name: error: ..." / "llama_model_load: error loading model".
_ERROR_LINE = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b|^(?:[\w.\-\[\]]+:\s*)?(?:error|fatal)\b")

#: Lines that only announce something (the traceback that follows, a stop) or are code.
_GENERIC = re.compile(r"Traceback \(most recent call last\)|Exception in ASGI application|"
                      r"Application startup failed|^\s*(?:\S+\s+)?File \"|Error in sys\.excepthook|^(?:raise|except)\b",
                      re.IGNORECASE)

#: How long a picked line may be (a summary is one line on a page, a reason, a log record).
TROUBLE_LINE_MAX = 240


def _cut(line: str) -> str:
    return line if len(line) <= TROUBLE_LINE_MAX else line[:TROUBLE_LINE_MAX - 1] + "…"


def _ignored_exceptions(candidates: list[tuple[int, str]]) -> set[int]:
    """Indices of exception lines Python reported as "Exception ignored in: ..." (a
    destructor failing while the process exits, after the real error): never the cause."""
    ignored, inside = set(), False
    for i, line in candidates:
        if "Exception ignored in" in line:
            inside = True
        elif inside and _EXCEPTION.search(line) and 'File "' not in line:
            ignored.add(i)
            inside = False
    return ignored


def trouble_line(lines: list[str]) -> tuple[int, str] | None:
    """The line of an engine's log lines that says what went wrong, and its index, in this
    order of preference: the port was taken ("address already in use"); the exception of
    the last Python traceback (its last line: "RuntimeError: CUDA out of memory", without
    the log prefix; one that points elsewhere, "see root cause above", gives way to the one
    before, and one Python reports as "Exception ignored in" is skipped; pydantic's "1
    validation error for X" gets the field and reason after it); a death by signal
    ("Segmentation fault (core dumped)"); the last line logged at error level (``ERROR``, ``CRITICAL``, ``error:``) that
    is more than an announcement; else the last line with a word of trouble ("failed",
    "not found"). Never an access-log line (a request's outcome, not the engine's trouble).
    Lines are cut to :data:`TROUBLE_LINE_MAX` characters. None when no line qualifies."""
    candidates = [(i, line.strip()) for i, line in enumerate(lines)
                  if line.strip() and not line.lstrip().startswith("---") and not _ACCESS_LOG.search(line)]
    for i, line in reversed(candidates):
        if _PORT_TAKEN.search(line):
            return i, _cut(line)
    ignored = _ignored_exceptions(candidates)
    for at, (i, line) in reversed(list(enumerate(candidates))):
        found = _EXCEPTION.search(line)
        if found and 'File "' not in line and i not in ignored:
            words = found.group(1) + (f": {found.group(2)}" if found.group(2) else "")
            if _VALIDATION_SUMMARY.search(words):  # the field and the reason follow
                words = " — ".join([words, *(text for _, text in candidates[at + 1:at + 3])])
            if not _NOT_THE_CAUSE.search(words):
                return i, _cut(words)
    for i, line in reversed(candidates):
        if _CRASH.search(line):
            return i, _cut(line)
    for i, line in reversed(candidates):
        if _ERROR_LINE.search(line) and not _GENERIC.search(line):
            return i, _cut(line)
    for i, line in reversed(candidates):
        if _TROUBLE.search(line) and not _GENERIC.search(line):
            return i, _cut(line)
    return None


#: Most characters of log an error carries (the control plane keeps an error's last 4,000).
ERROR_EXCERPT_MAX = 3000


def error_excerpt(log: str, lines: int = 15, secret: str = "") -> str:
    """What of an engine's log goes into its replica's error (``fleet.agent.engines``): the
    last ``lines`` lines, preceded, when the line that says what went wrong
    (:func:`trouble_line`) lies above them, by that line and "…" — a long traceback or a
    shutdown's chatter must not push the cause out. ``secret`` (the engine's key) is masked
    as ``***`` before anything is cut, so no part of it survives. Each line is cut to 500
    characters, and the oldest tail lines go until it fits :data:`ERROR_EXCERPT_MAX`."""
    if secret:
        log = log.replace(secret, "***")
    all_lines = [line if len(line) <= 500 else line[:499] + "…" for line in log.strip().splitlines()]
    tail = all_lines[-lines:] if lines > 0 else []
    picked = trouble_line(all_lines)
    head = [picked[1], "…"] if picked is not None and picked[0] < len(all_lines) - len(tail) else []
    while tail and sum(len(line) + 1 for line in head + tail) > ERROR_EXCERPT_MAX:
        tail = tail[1:]
    return "\n".join(head + tail)


def error_summary(error: str | None) -> str:
    """One line for a replica's error: the agent's own words ("engine exited with code 1",
    "port 20002 taken by pid 4711 (python3)") — the first line of the error, before the
    engine's last log lines that the agent appends (``fleet.agent.engines.EngineManager._fail``)
    — followed by the log line that says what went wrong (:func:`trouble_line`: the port
    taken, the exception, an error-level line; "RuntimeError: CUDA out of memory"), when one
    does. An access-log line is never the summary. "" for no error."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return ""
    first = lines[0].rstrip(":;, ")
    picked = trouble_line(lines[1:])
    trouble = picked[1] if picked else ""
    return f"{first}: {trouble}" if trouble and trouble not in first else first


def port_free(host: str, port: int) -> bool:
    """Whether a TCP listener could bind ``host:port`` on this machine right now. ``host``
    is an IPv4 or IPv6 address (an IPv6 one unbracketed, a zone such as ``%eth0`` allowed)
    or a host name, read as IPv4; ``SO_REUSEADDR`` as servers set it, so a port left in
    TIME_WAIT counts as free. False when it is taken or cannot be bound; raises OSError
    (``errno.EADDRNOTAVAIL``) when ``host`` is not an address of this machine, which no
    other port would cure. Shared by the agent (the ports of its engines) and ``llmgw up``
    (its own port)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        ip = None
    family = socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise
            return False
    return True


def check_address(address: Any, *, peer_is_loopback: bool) -> str:
    """The address an agent advertises for its engines (``hello.address``), checked: an IP
    address or a DNS host name (RFC 1123 labels, at most 253 characters) and nothing else —
    no scheme, ``user@``, port, path, brackets or spaces, since the gateway builds
    ``http://ADDRESS:PORT/`` from it. The empty string (not advertised) passes.

    A loopback address (``127.0.0.0/8``, ``::1``, ``localhost``) is accepted only from an
    agent that itself connected over loopback (``peer_is_loopback``): from anywhere else it
    would point the gateway at the control plane's own local services. Unspecified
    (``0.0.0.0``, ``::``), multicast and link-local addresses (``169.254.169.254``: cloud
    metadata) are never an engine's address.

    IPv4 in any notation other than a dotted quad (``0x7f000001``, ``0x7f.1``,
    ``2130706433``, ``127.1``) is refused, since resolvers read it as an address the checks
    above never saw; so is a loopback name from ``/etc/hosts`` (``ip6-localhost``, …) from a
    remote agent. A host name is checked as written, not resolved: what its DNS answers is the
    operator's to trust.

    Returns the address (IPv6 in its compressed form); raises ProtocolError naming the
    rule it broke (docs/architecture.md, "Agent protocol": ``check_address``)."""
    if not isinstance(address, str):
        raise ProtocolError(f"address must be a string, not {type(address).__name__}")
    if address == "":
        return ""
    if len(address) > MAX_ADDRESS_LEN:
        raise ProtocolError(f"address is {len(address)} characters long (at most {MAX_ADDRESS_LEN})")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.scope_id:
                raise ProtocolError(f"address {address[:80]!r} has a zone (%…): advertise an address without one")
            if ip in _IPV4_COMPATIBLE and not ip.is_loopback and not ip.is_unspecified:
                raise ProtocolError(f"address {address!r} is a deprecated IPv4-compatible IPv6 address: "
                                    "advertise the IPv4 address itself")
            if ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
        if ip.is_unspecified or ip.is_multicast or ip.is_link_local:
            raise ProtocolError(f"address {address!r} is not an address engines can be reached at")
        if ip.is_loopback and not peer_is_loopback:
            raise ProtocolError(f"address {address!r} is loopback, but this agent did not connect over loopback")
        return str(ip)
    name = address[:-1] if address.endswith(".") else address
    labels = name.split(".")
    if not name or not all(_LABEL.match(label) for label in labels):
        raise ProtocolError(f"address {address[:80]!r} is neither an IP address nor a host name "
                            "(letters, digits, '-' and '.'; no scheme, user, port or path)")
    if _numeric_ipv4(name):
        raise ProtocolError(f"address {address[:80]!r} is an IPv4 address in another notation (hex, octal, "
                            "decimal or short): write it as four decimal numbers, a.b.c.d")
    if (labels[-1].lower() == "localhost" or name.lower() in _LOOPBACK_NAMES) and not peer_is_loopback:
        raise ProtocolError(f"address {address!r} is loopback, but this agent did not connect over loopback")
    return address


def _require(message: dict, key: str, kinds: tuple[type, ...], what: str, *, optional: bool = False,
             where: str = "") -> None:
    """Check ``message[key]``; ``where`` names a nested object in the error (``inventory``,
    ``inventory.gpus[]``, ``replicas[]``), else the message's type."""
    where = where or str(message.get("type"))
    if key not in message:
        if optional:
            return
        raise ProtocolError(f"{where}: {key!r} is missing")
    value = message[key]
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ProtocolError(f"{where}: {key!r} must be {what}, not {type(value).__name__}")


def _check_inventory(message: dict, *, optional: bool) -> None:
    if optional and message.get("inventory") is None:
        return  # absent or null: nothing reported
    _require(message, "inventory", (dict,), "an object")
    inventory = message["inventory"]
    for key in ("cpu_cores", "memory_mib"):
        _require(inventory, key, (int,), "an integer", optional=True, where="inventory")
    _require(inventory, "gpus", (list,), "a list", optional=True, where="inventory")
    gpus = inventory.get("gpus") or []
    if len(gpus) > MAX_GPUS:
        raise ProtocolError(f"inventory lists {len(gpus)} GPUs (at most {MAX_GPUS})")
    for gpu in gpus:
        if not isinstance(gpu, dict):
            raise ProtocolError("inventory: every GPU must be an object")
        _require(gpu, "index", (int,), "an integer", optional=True, where="inventory.gpus[]")
        for key in ("uuid", "name"):
            _require(gpu, key, (str,), "a string", optional=True, where="inventory.gpus[]")
        _check_reading_figures(gpu, "inventory.gpus[]")


#: A reading's figures: key → (types, words), each optional and nullable.
_READING_FIGURES = (("memory_used_mib", (int,), "an integer or null"),
                    ("memory_total_mib", (int,), "an integer or null"),
                    ("utilisation_pct", (int, float), "a number or null"),
                    ("temperature_c", (int, float), "a number or null"))


def _check_reading_figures(gpu: dict, where: str) -> None:
    for key, kinds, what in _READING_FIGURES:
        if gpu.get(key) is not None:
            _require(gpu, key, kinds, what, where=where)


def _check_gpu_readings(message: dict) -> None:
    _require(message, "gpus", (list,), "a list", optional=True)
    readings = message.get("gpus") or []
    if len(readings) > MAX_GPUS:
        raise ProtocolError(f"heartbeat: {len(readings)} GPU readings (at most {MAX_GPUS})")
    for reading in readings:
        if not isinstance(reading, dict):
            raise ProtocolError("heartbeat: every GPU reading must be an object")
        _require(reading, "index", (int,), "an integer", where="gpus[]")
        _check_reading_figures(reading, "gpus[]")


def _check_replicas(message: dict) -> None:
    _require(message, "replicas", (list,), "a list", optional=True)
    reports = message.get("replicas") or []
    if len(reports) > MAX_REPLICA_REPORTS:
        raise ProtocolError(f"{len(reports)} replica reports (at most {MAX_REPLICA_REPORTS})")
    for report in reports:
        if not isinstance(report, dict):
            raise ProtocolError("every replica report must be an object")
        _require(report, "replica_id", (int,), "an integer", where="replicas[]")
        _require(report, "state", (str,), "a string", optional=True, where="replicas[]")
        for key, kinds, what in (("error", (str,), "a string or null"), ("pid", (int,), "an integer or null"),
                                 ("port", (int,), "an integer or null"),
                                 ("running", (int, float), "a number or null"),
                                 ("waiting", (int, float), "a number or null"),
                                 ("progress", (int, float), "a number or null"),
                                 ("weights_context_length", (int,), "an integer or null")):
            if report.get(key) is not None:
                _require(report, key, kinds, what, where="replicas[]")


def _check_loads(message: dict) -> None:
    _require(message, "loads", (list,), "a list", optional=True)
    loads = message.get("loads") or []
    if len(loads) > MAX_REPLICA_REPORTS:
        raise ProtocolError(f"heartbeat: {len(loads)} loads (at most {MAX_REPLICA_REPORTS})")
    for load in loads:
        if not isinstance(load, list) or len(load) != 3:
            raise ProtocolError("heartbeat: every load must be [replica_id, running, waiting]")
        replica_id, *counts = load
        if isinstance(replica_id, bool) or not isinstance(replica_id, int):
            raise ProtocolError(f"heartbeat: a load's replica_id must be an integer, not {type(replica_id).__name__}")
        for count in counts:
            if count is not None and (isinstance(count, bool) or not isinstance(count, (int, float))):
                raise ProtocolError(f"heartbeat: a load's counts must be numbers or null, not {type(count).__name__}")


def check_fields(message: dict) -> dict:
    """Check the type of every field of an agent's ``hello``, ``status`` or ``heartbeat``
    (the shapes of :class:`Hello`, :class:`Status` and :class:`Heartbeat`) and the sizes of
    its lists.
    Returns ``message``; raises ProtocolError naming the first bad field, so a lying or
    broken agent gets an answer and nothing of its message is recorded."""
    kind = message.get("type")
    if kind == "hello":
        for key, top in (("name", MAX_NAME_LEN), ("version", MAX_VERSION_LEN)):
            _require(message, key, (str,), "a string", optional=True)
            if len(message.get(key) or "") > top:
                raise ProtocolError(f"hello: {key!r} is longer than {top} characters")
        _require(message, "address", (str,), "a string", optional=True)
        _check_inventory(message, optional=True)
        _check_replicas(message)
    elif kind == "status":
        _check_inventory(message, optional=True)
        _check_replicas(message)
    elif kind == "heartbeat":
        _check_loads(message)
        _check_gpu_readings(message)
    return message


def loads_of(reports: list[ReplicaReport]) -> list[ReplicaLoad]:
    """The ``loads`` of a heartbeat from an agent's replica reports: ``[replica_id,
    running, waiting]`` for each ready replica whose load is known (at least one of the
    two counts), in report order."""
    return [
        [r["replica_id"], r.get("running"), r.get("waiting")]
        for r in reports
        if r.get("state") == "ready" and (r.get("running") is not None or r.get("waiting") is not None)
    ]


def heartbeat(loads: list[ReplicaLoad] | None = None, gpus: list[GpuReading] | None = None) -> Heartbeat:
    """A heartbeat; with ``loads`` and ``gpus`` (see :class:`Heartbeat`) unless there are none."""
    message: Heartbeat = {"type": "heartbeat", "v": PROTOCOL_VERSION}
    if loads:
        message["loads"] = list(loads)
    if gpus:
        message["gpus"] = list(gpus)
    return message


def readings_of(gpus: list[GpuInfo]) -> list[GpuReading]:
    """The ``gpus`` of a heartbeat from an inventory's GPUs: index, memory, utilisation and
    temperature of each (None where unknown)."""
    return [{"index": g["index"], "memory_used_mib": g.get("memory_used_mib"),
             "memory_total_mib": g.get("memory_total_mib"), "utilisation_pct": g.get("utilisation_pct"),
             "temperature_c": g.get("temperature_c")} for g in gpus]


def restart_agent() -> RestartAgent:
    return {"type": "restart_agent", "v": PROTOCOL_VERSION}
