"""What the operating system shows the soak (tests/soak.py): the fake engines running under
one directory, read from ``/proc`` (argv, environment, process group, working directory),
and who listens on which TCP port (``/proc/net/tcp*`` and the owners' socket fds). Linux only;
nothing here reads the control plane's tables (docs/architecture.md, "Testing": the soak)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

#: The profile environment variable a soak engine carries: the GPU memory (MiB, per GPU)
#: its profile gave it when it was started. Engines see no ``LLMGW_*`` variable.
GPU_MEMORY_ENV = "SOAK_GPU_MEMORY_MIB"


@dataclass(frozen=True)
class EngineProcess:
    """One live fake-engine process: ``key`` is its ``--api-key`` (the replica's engine key),
    ``agent`` the agent whose state directory is its working directory, ``gpus`` the indices
    in its ``CUDA_VISIBLE_DEVICES``, ``gpu_memory_mib`` its ``SOAK_GPU_MEMORY_MIB`` (0 if unset)."""

    pid: int
    start_ticks: int
    pgid: int
    agent: str
    key: str
    port: int | None
    served_name: str
    argv: tuple[str, ...]
    gpus: tuple[int, ...]
    gpu_memory_mib: int
    env: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def arg(self, name: str) -> str | None:
        """The value after ``name`` on its argv (None if absent)."""
        argv = list(self.argv)
        return argv[argv.index(name) + 1] if name in argv[:-1] else None

    def describe(self) -> str:
        return (f"pid {self.pid} (agent {self.agent}, port {self.port}, served name {self.served_name}, "
                f"CUDA_VISIBLE_DEVICES={','.join(map(str, self.gpus))!s}, {self.gpu_memory_mib} MiB/GPU)")


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, process group, start time in clock ticks) of ``pid``, None if gone."""
    try:
        fields = _read(f"/proc/{pid}/stat").decode().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2]), int(fields[19])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in _read(f"/proc/{pid}/cmdline").split(b"\0") if a]
    except OSError:
        return []


def engine_processes(root: Path, agents_by_dir: dict[Path, str]) -> list[EngineProcess]:
    """Every live fake engine (``tests/fake_engine.py`` on its argv) whose working directory is
    one of ``agents_by_dir`` (an agent's state directory, under ``root``) — the soak's own,
    not another run's on the same machine."""
    out: list[EngineProcess] = []
    root_text = str(root)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            raw = _read(f"/proc/{pid}/cmdline")
        except OSError:
            continue
        if b"fake_engine.py" not in raw:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if not cwd.startswith(root_text):
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        agent = agents_by_dir.get(Path(cwd), f"unknown ({cwd})")
        try:
            env = dict(item.decode(errors="replace").partition("=")[::2]
                       for item in _read(f"/proc/{pid}/environ").split(b"\0") if item)
        except OSError:
            env = {}
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        process = EngineProcess(pid=pid, start_ticks=stat[2], pgid=stat[1], agent=agent, key="", port=None,
                                served_name="", argv=argv, env=env,
                                gpus=tuple(int(i) for i in env.get("CUDA_VISIBLE_DEVICES", "").split(",")
                                           if i.strip().isdigit()),
                                gpu_memory_mib=int(env.get(GPU_MEMORY_ENV, "0") or 0))
        port = process.arg("--port")
        out.append(EngineProcess(**{**process.__dict__, "key": process.arg("--api-key") or "",
                                    "port": int(port) if port and port.isdigit() else None,
                                    "served_name": process.arg("--served-name") or ""}))
    return out


def agent_processes(root: Path) -> dict[int, Path]:
    """Pid → state directory of every live ``llmgw agent`` process whose ``--state-dir`` is
    under ``root`` (the soak's own agents, whoever started them)."""
    out: dict[int, Path] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        argv = cmdline(pid)
        if "agent" not in argv or "--state-dir" not in argv[:-1]:
            continue
        state_dir = Path(argv[argv.index("--state-dir") + 1])
        if state_dir.is_relative_to(root) and alive(pid):
            out[pid] = state_dir
    return out


def listening_inodes() -> dict[int, int]:
    """TCP port → socket inode of every listening socket (IPv4 and IPv6)."""
    out: dict[int, int] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = _read(name).decode().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A":  # TCP_LISTEN
                out.setdefault(int(parts[1].rsplit(":", 1)[1], 16), int(parts[9]))
    return out


def socket_inodes(pid: int) -> set[int]:
    """The socket inodes ``pid`` holds open."""
    out: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def listeners(ports: set[int], candidates: list[int]) -> dict[int, int | None]:
    """For each of ``ports`` that something listens on: the pid among ``candidates`` holding
    that socket, or None (a process outside them: another user's, another run's). Ports
    nothing listens on are left out."""
    by_port = {port: inode for port, inode in listening_inodes().items() if port in ports}
    if not by_port:
        return {}
    owner: dict[int, int] = {}
    for pid in candidates:
        for inode in socket_inodes(pid):
            owner.setdefault(inode, pid)
    return {port: owner.get(inode) for port, inode in by_port.items()}
