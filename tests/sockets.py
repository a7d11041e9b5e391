"""What the kernel says about a port on this machine: who listens on it, whether a
connection to it is refused (engines reachable only through the gateway, issue 12)."""

from __future__ import annotations

import socket


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port``, read from /proc/net/tcp{,6}
    (what the kernel says, not what the engine printed)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)
                    if width == 8:
                        found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                    else:  # four little-endian 32-bit words
                        words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                        found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def refused(host: str, port: int) -> bool:
    """A TCP connection to ``host``:``port`` is refused (nothing listens there); a connection
    accepted is ``False``; a timeout (5 s) or another error raises."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True
