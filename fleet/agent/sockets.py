"""Who listens on a port, as the kernel says (Linux /proc), so that an engine counts as ready
only when the process answering on its port is one of its own (docs/architecture.md,
"Decisions": readiness proves identity).

The listening sockets come from ``/proc/net/tcp`` and ``/proc/net/tcp6`` (state ``0A``), each
with its inode; the processes holding an inode from their ``/proc/PID/fd`` links
(``socket:[INODE]``); a process's group from ``/proc/PID/stat``. Only reads; no state. Where
``/proc/net`` cannot be read (not Linux) :func:`port_holders` answers None and the caller
falls back to what the engine answers over HTTP.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass, field

#: The kernel's TCP state for a listening socket in /proc/net/tcp{,6}.
LISTEN = "0A"
TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6))


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its local ``address`` (text, IPv4 or IPv6), ``port`` and inode."""

    address: str
    port: int
    inode: int


@dataclass
class PortHolders:
    """What listens on one port: ``ours`` — pids of the engine's process group holding a
    listening socket there; ``foreign`` — ``(pid, name)`` of every other process holding one
    (pid None when its owner is not visible to this user: another user's process)."""

    ours: set[int] = field(default_factory=set)
    foreign: list[tuple[int | None, str]] = field(default_factory=list)

    @property
    def listening(self) -> bool:
        return bool(self.ours or self.foreign)

    def taken_by(self, port: int) -> str:
        """The words for a port another process holds: "port 20002 taken by pid 4711 (python3)"."""
        if not self.foreign:
            return ""
        pid, name = self.foreign[0]
        if pid is None:
            return f"port {port} taken by a process this agent cannot see (another user's)"
        return f"port {port} taken by pid {pid} ({name})"


def _address(hex_address: str, family: int) -> str:
    raw = bytes.fromhex(hex_address)
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[::-1])
    # Four 32-bit words, each in host (little-endian) order.
    return socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listeners(port: int) -> list[Listener] | None:
    """Every socket listening on TCP ``port`` (any address), or None if the kernel's tables
    cannot be read (not Linux, or /proc not mounted)."""
    found: list[Listener] = []
    readable = False
    for table, family in TABLES:
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            hex_address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port:
                found.append(Listener(_address(hex_address, family), port, int(fields[9])))
    return found if readable else None


def overlaps(listener_address: str, host: str) -> bool:
    """Whether a socket listening on ``listener_address`` takes connections meant for an
    engine listening on ``host``: the same address, or either is a wildcard (``::`` is taken
    as dual-stack, as Linux's default is). IPv4-mapped IPv6 addresses count as IPv4."""
    def parse(text: str):
        ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
        return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped else ip

    try:
        a, b = parse(listener_address), parse(host or "0.0.0.0")
    except ValueError:
        return True  # a host name: cannot tell, so it counts
    if a == b:
        return True
    for one, other in ((a, b), (b, a)):
        if one.is_unspecified and (one.version == 6 or other.version == 4):
            return True
    return False


def process_group(pid: int) -> int | None:
    """The process group of ``pid`` (field 5 of /proc/PID/stat), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def process_name(pid: int) -> str:
    """The command name of ``pid`` (/proc/PID/comm), "?" if unknown."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip() or "?"
    except OSError:
        return "?"


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes in process group ``pgid``."""
    members = []
    for entry in _pids():
        if process_group(entry) == pgid:
            members.append(entry)
    return members


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets ``pid`` holds open (empty if its fds cannot be read)."""
    inodes = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def port_holders(port: int, host: str, pgid: int) -> PortHolders | None:
    """Who listens on ``port`` where an engine on ``host`` would (:func:`overlaps`): the pids
    of process group ``pgid`` (the engine's: it runs in a session of its own, so its pgid is
    its pid) and every other process. None where /proc/net cannot be read. The engine's group
    is searched first (cheap); every process only for sockets it does not hold."""
    found = listeners(port)
    if found is None:
        return None
    wanted = {item.inode for item in found if overlaps(item.address, host)}
    holders = PortHolders()
    if not wanted:
        return holders
    ours_inodes: set[int] = set()
    for pid in group_members(pgid):
        held = socket_inodes(pid) & wanted
        if held:
            holders.ours.add(pid)
            ours_inodes |= held
    rest = wanted - ours_inodes
    if rest:
        seen: set[int] = set()
        for pid in _pids():
            if pid in holders.ours:
                continue
            held = socket_inodes(pid) & rest
            if held:
                holders.foreign.append((pid, process_name(pid)))
                seen |= held
        if rest - seen:  # held by a process whose fds this user cannot read
            holders.foreign.append((None, "?"))
    return holders
