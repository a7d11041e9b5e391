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
    Each reports 0 MiB used and no utilisation nor temperature (None). ``""`` gives ``[]``. ValueError for anything else (a count or
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
                         "memory_total_mib": mib, "memory_used_mib": 0, "utilisation_pct": None,
                         "temperature_c": None})
    return gpus


def read_gpus() -> list[GpuInfo]:
    """Every NVIDIA GPU with its memory (MiB), compute utilisation (percent) and temperature
    (°C, the GPU die: ``NVML_TEMPERATURE_GPU``); ``[]`` when there is no driver or library.

    Each reading is optional: an NVMLError on one (a driver or GPU that does not support it)
    leaves that figure unknown — None for utilisation and temperature, the memory keys left
    out — and never drops the GPU. Only a GPU the driver cannot find at all is left out, and
    failing to count them ends the list."""
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
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:  # nothing of this one can be read; the others can
                log.warning("could not reach GPU %d: %s", index, exc)
                continue
            gpu: GpuInfo = {"index": index,
                            "uuid": _text(_reading(pynvml, index, "uuid", "nvmlDeviceGetUUID", handle)),
                            "name": _text(_reading(pynvml, index, "name", "nvmlDeviceGetName", handle))}
            memory = _reading(pynvml, index, "memory", "nvmlDeviceGetMemoryInfo", handle)
            if memory is not None:
                gpu["memory_total_mib"] = int(memory.total // (1024 * 1024))
                gpu["memory_used_mib"] = int(memory.used // (1024 * 1024))
            rates = _reading(pynvml, index, "utilisation", "nvmlDeviceGetUtilizationRates", handle)
            gpu["utilisation_pct"] = None if rates is None else float(rates.gpu)
            temperature = _reading(pynvml, index, "temperature", "nvmlDeviceGetTemperature", handle,
                                   getattr(pynvml, "NVML_TEMPERATURE_GPU", 0))
            gpu["temperature_c"] = None if temperature is None else float(temperature)
            gpus.append(gpu)
    except pynvml.NVMLError as exc:
        log.warning("could not read GPUs: %s", exc)
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return gpus


#: (GPU index, reading) pairs already logged as refused: each is said once, not every reading.
_refused: set[tuple[int, str]] = set()


def _reading(pynvml, index: int, what: str, function: str, *args):
    """``pynvml.<function>(*args)``, or None when the driver refuses it (an NVMLError, or a
    function this nvidia-ml-py no longer has), logged once per GPU and reading."""
    try:
        return getattr(pynvml, function)(*args)
    except (pynvml.NVMLError, AttributeError) as exc:
        if (index, what) not in _refused:
            _refused.add((index, what))
            log.info("GPU %d: its %s cannot be read (%s); reported as unknown", index, what, exc)
        return None


def _text(value) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def current_gpus() -> list[GpuInfo]:
    """This machine's GPUs as read now: the simulated ones with ``LLMGW_AGENT_FAKE_GPUS`` set
    (no utilisation nor temperature: None), else :func:`read_gpus`. ValueError if the
    simulated GPUs do not parse."""
    fake = os.environ.get(FAKE_GPUS_ENV, "").strip()
    return parse_fake_gpus(fake) if fake else read_gpus()


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
    return {"gpus": current_gpus(), "cpu_cores": cores, "memory_mib": read_memory_mib()}
