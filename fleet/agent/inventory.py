"""What this machine has: GPUs through pynvml (``nvidia-ml-py``), CPU cores and RAM.

A machine without an NVIDIA driver is a CPU-only machine, not an error. For tests and demos
an agent can report simulated GPUs instead (``llmgw agent --fake-gpus 2x24576``, env
``LLMGW_AGENT_FAKE_GPUS``; docs/architecture.md, "Processes"): no driver is asked, and
engines still get ``CUDA_VISIBLE_DEVICES`` naming the simulated indices.
"""

from __future__ import annotations

import logging
import os

from fleet.protocol import GpuInfo, Inventory

log = logging.getLogger(__name__)
_no_driver = False  # once NVML is known absent, do not ask (and log) again
#: Environment variable naming simulated GPUs, as ``--fake-gpus`` does (``COUNTxMIB``).
FAKE_GPUS_ENV = "LLMGW_AGENT_FAKE_GPUS"


def parse_fake_gpus(spec: str) -> list[GpuInfo]:
    """Simulated GPUs from ``COUNTxMIB`` (e.g. ``2x24576``: two GPUs of 24576 MiB each),
    several groups joined by commas (``1x81920,2x24576``: indices follow in that order).
    Each reports 0 MiB used. ``""`` gives ``[]``. ValueError for anything else (a count or
    size that is not a positive integer)."""
    gpus: list[GpuInfo] = []
    for group in (g.strip() for g in spec.split(",")):
        if not group:
            continue
        count_text, sep, mib_text = group.lower().partition("x")
        try:
            count, mib = int(count_text), int(mib_text)
        except ValueError:
            raise ValueError(f"fake GPUs {group!r} are not COUNTxMIB (e.g. 2x24576)") from None
        if not sep or count < 1 or mib < 1:
            raise ValueError(f"fake GPUs {group!r} are not COUNTxMIB with a positive count and size")
        for _ in range(count):
            index = len(gpus)
            gpus.append({"index": index, "uuid": f"GPU-fake-{index:04d}", "name": f"Simulated GPU {mib} MiB",
                         "memory_total_mib": mib, "memory_used_mib": 0})
    return gpus


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
    """This machine's GPUs, CPU cores and RAM (MiB). With ``LLMGW_AGENT_FAKE_GPUS`` set (by
    ``--fake-gpus``), its simulated GPUs instead of the real ones (:func:`parse_fake_gpus`;
    ValueError if it does not parse)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    fake = os.environ.get(FAKE_GPUS_ENV, "").strip()
    gpus = parse_fake_gpus(fake) if fake else read_gpus()
    return {"gpus": gpus, "cpu_cores": cores, "memory_mib": read_memory_mib()}
