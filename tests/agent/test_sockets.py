"""Who listens on a port, read from /proc with real sockets and processes (fleet.agent.sockets)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from fleet.agent import sockets
from tests.processes import fake_engine, free_port, wait_for_port

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="Linux /proc only")


def listening_socket(host: str = "127.0.0.1", family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_a_socket_this_process_listens_on_is_found_with_its_inode_and_owner():
    with listening_socket() as sock:
        port = sock.getsockname()[1]
        found = sockets.listeners(port)
        assert [(item.address, item.port) for item in found] == [("127.0.0.1", port)]
        assert found[0].inode == os.fstat(sock.fileno()).st_ino
        assert found[0].inode in sockets.socket_inodes(os.getpid())
        mine = sockets.port_holders(port, "127.0.0.1", os.getpgid(0))
        assert mine.ours == {os.getpid()} and mine.foreign == []
        # Seen from another group (an engine's), this process is a foreign holder, named.
        other = sockets.port_holders(port, "127.0.0.1", pgid=1)
        assert other.ours == set() and other.foreign == [(os.getpid(), sockets.process_name(os.getpid()))]
        assert other.taken_by(port) == f"port {port} taken by pid {os.getpid()} ({sockets.process_name(os.getpid())})"


def _loopback_v6() -> bool:
    """Whether this machine can listen on ::1."""
    if not socket.has_ipv6:
        return False
    try:
        listening_socket("::1", socket.AF_INET6).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _loopback_v6(), reason="this machine cannot listen on ::1")
def test_an_ipv6_listener_and_a_free_port():
    sock = listening_socket("::1", socket.AF_INET6)
    with sock:
        port = sock.getsockname()[1]
        assert [item.address for item in sockets.listeners(port)] == ["::1"]
        assert sockets.port_holders(port, "::1", os.getpgid(0)).ours == {os.getpid()}
        assert not sockets.port_holders(port, "127.0.0.1", os.getpgid(0)).listening  # another address
    free = free_port()
    assert sockets.listeners(free) == []
    assert not sockets.port_holders(free, "127.0.0.1", os.getpgid(0)).listening


def test_an_engine_in_a_session_of_its_own_holds_its_port_in_its_group(tmp_path):
    port = free_port()
    engine = fake_engine(port, tmp_path)
    try:
        wait_for_port(port, proc=engine.proc)
        assert sockets.process_group(engine.pid) == engine.pid
        assert engine.pid in sockets.group_members(engine.pid)
        holders = sockets.port_holders(port, "127.0.0.1", engine.pid)
        assert holders.ours == {engine.pid} and holders.foreign == []
        assert sockets.process_name(engine.pid).startswith("python")
        taken = sockets.port_holders(port, "127.0.0.1", os.getpgid(0))  # as another engine sees it
        assert taken.foreign == [(engine.pid, sockets.process_name(engine.pid))] and not taken.ours
    finally:
        engine.stop()


@pytest.mark.parametrize("listener, host, overlap", [
    ("127.0.0.1", "127.0.0.1", True), ("0.0.0.0", "127.0.0.1", True), ("127.0.0.1", "0.0.0.0", True),
    ("::", "127.0.0.1", True), ("::ffff:127.0.0.1", "127.0.0.1", True), ("127.0.0.1", "10.0.0.5", False),
    ("::1", "127.0.0.1", False), ("0.0.0.0", "::1", False), ("fd00::5", "[fd00::5]", True),
])
def test_which_listening_addresses_take_an_engines_connections(listener, host, overlap):
    assert sockets.overlaps(listener, host) is overlap


def test_without_proc_the_answer_is_unknown(monkeypatch):
    monkeypatch.setattr(sockets, "TABLES", (("/nonexistent/tcp", socket.AF_INET),))
    assert sockets.listeners(20000) is None
    assert sockets.port_holders(20000, "127.0.0.1", os.getpgid(0)) is None

