"""Reading py-spy's collapsed stacks for bench/gateway.py: where a server's time goes, by
package, by who pays (the innermost llmgw function, or a sync_to_async thread's task), our
functions inclusive, and the hottest leaf functions."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
PACKAGES = [  # (label, path prefix as py-spy prints it) - first match wins
    ("llmgw gateway/", "gateway/"), ("llmgw fleet/", "fleet/"), ("llmgw catalog/", "catalog/"),
    ("llmgw llmgw/", "llmgw/"),
    ("django db", "django/db/"), ("django", "django/"), ("asgiref", "asgiref/"), ("channels", "channels/"),
    ("daphne", "daphne/"), ("twisted", "twisted/"), ("autobahn", "autobahn/"), ("uvicorn", "uvicorn/"),
    ("httpx", "httpx/"), ("httpcore", "httpcore/"), ("h11", "h11/"), ("anyio", "anyio/"), ("sniffio", "sniffio/"),
    ("prometheus_client", "prometheus_client/"), ("sqlite3", "sqlite3/"), ("asyncio", "asyncio/"),
    ("concurrent.futures", "concurrent/"), ("threading", "threading.py"), ("logging", "logging/"),
]


def frame_path(frame: str) -> str:
    m = _FRAME.match(frame)
    path = (m.group("file") if m else frame).replace("\\", "/")
    for marker in ("site-packages/", str(ROOT) + "/", "/lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3.":
                path = path.split("/", 1)[-1]
    return path


def frame_package(frame: str) -> str:
    path = frame_path(frame)
    return next((label for label, prefix in PACKAGES if path.startswith(prefix)), "python (other)")


def frame_name(frame: str) -> str:
    m = _FRAME.match(frame)
    return f"{m.group('func')} ({frame_path(frame)})" if m else frame


def _ours(frame: str) -> bool:
    return frame_package(frame).startswith("llmgw") and "llmgw/asgi.py" not in frame


def summarize_profile(path: Path, top: int = 12) -> str:
    """Where the time goes in a py-spy raw (collapsed) file: by package of the leaf frame;
    by who pays (the innermost llmgw function on the stack, or the function a sync_to_async
    worker thread runs, or the server/framework) and what it spends on; our functions
    inclusive; the hottest leaf functions."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
            if frames:
                stacks.append((frames, int(count)))
    total = sum(c for _, c in stacks) or 1
    by_package: Counter[str] = Counter()
    payer: Counter[str] = Counter()
    ours_inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for frames, count in stacks:
        leaf_package = frame_package(frames[-1])
        by_package[leaf_package] += count
        leaf[frame_name(frames[-1])] += count
        ours = [f for f in frames if _ours(f)]
        for name in {frame_name(f) for f in ours}:
            ours_inclusive[name] += count
        if ours:
            who = frame_name(ours[-1])
        elif any("thread_handler (asgiref/sync.py" in f for f in frames):
            last_asgiref = max(i for i, f in enumerate(frames) if frame_package(f) == "asgiref")
            handed = frames[last_asgiref + 1] if last_asgiref + 1 < len(frames) else frames[-1]
            who = f"sync_to_async thread: {frame_name(handed)}"
        else:
            who = "server/framework (no llmgw frame)"
        payer[f"{who} -> {leaf_package}"] += count
    pct = lambda n: f"{100 * n / total:5.1f}%"  # noqa: E731
    out = [f"  {path.name}: {total} samples (GIL holder only)", "  by package of the leaf frame:"]
    out += [f"    {pct(n)}  {name}" for name, n in by_package.most_common(top)]
    out.append("  who pays -> for what (innermost llmgw function, or a sync_to_async thread's task):")
    out += [f"    {pct(n)}  {name}" for name, n in payer.most_common(top + 8)]
    out.append("  our functions, inclusive (anything they call):")
    out += [f"    {pct(n)}  {name}" for name, n in ours_inclusive.most_common(top)]
    out.append("  hottest leaf functions:")
    out += [f"    {pct(n)}  {name}" for name, n in leaf.most_common(top)]
    return "\n".join(out)
