"""What this machine has: GPUs through pynvml (``nvidia-ml-py``), CPU cores and RAM.

A machine without an NVIDIA driver is a CPU-only machine, not an error.
"""

from __future__ import annotations

import logging
import os

from fleet.protocol import GpuInfo, Inventory

log = logging.getLogger(__name__)
_no_driver = False  # once NVML is known absent, do not ask (and log) again


def read_gpus() -> list[GpuInfo]:
    """Every NVIDIA GPU with its memory in MiB; ``[]`` when there is no driver or library."""
    global _no_driver
    if _no_driver:
        return []
    try:
        import pynvml  # lazy: present only where an NVIDIA driver is; absent means no GPUs
    except ImportError:
        _no_driver = True
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no NVIDIA GPUs here (%s): reporting a CPU-only machine", exc)
        _no_driver = True
        return []
    gpus: list[GpuInfo] = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            gpus.append(
                {
                    "index": index,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_total_mib": int(memory.total // (1024 * 1024)),
                    "memory_used_mib": int(memory.used // (1024 * 1024)),
                }
            )
    except pynvml.NVMLError as exc:
        log.warning("could not read GPUs: %s", exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return gpus


def read_memory_mib() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


def read_inventory() -> Inventory:
    """This machine's GPUs, CPU cores and RAM (MiB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"gpus": read_gpus(), "cpu_cores": cores, "memory_mib": read_memory_mib()}
