"""The soak's invariants and convergence (tests/soak.py; docs/architecture.md, "Testing":
the soak), as a mixin of :class:`tests.soak.Soak`: what the OS shows (tests/soak_os.py)
against what the control plane believes and the catalog asks. Bounds and graces below."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from tests.soak_os import EngineProcess, alive, cmdline, engine_processes, listeners

#: Agents: name → ``--fake-gpus`` ("" = CPU-only). Engine ports: ``23100 + 100 * n``.
AGENTS = {"gpu-a": "2x24576", "gpu-b": "1x49152", "cpu": ""}
GPU_MIB = {"gpu-a": [24576, 24576], "gpu-b": [49152], "cpu": []}
PORT_BASE = 23100
DRAIN_GRACE_S, STOP_GRACE_S, LOST_AFTER_S = 2.0, 2.0, 5.0  # FAULT_ENV's and MultiCluster's
#: An unwanted engine may run this long while its agent runs: drain + stop grace + 5 s.
ORPHAN_GRACE_S = DRAIN_GRACE_S + STOP_GRACE_S + 5.0
READY_GRACE_S = 3.0
#: After an engine dies, a process that takes its port at once may answer requests sent
#: this long after the death: the agent sees the exit at once (a pidfd), reports it, and the
#: next routing refresh drops the replica (docs/architecture.md, "Decisions": readiness
#: proves identity). Later than that is a routing violation.
CRASH_WINDOW_S = 1.0
COLD_START_TIMEOUT_S = 10
#: Every request is answered within this: the cold-start hold + 20 s.
REQUEST_BOUND_S = COLD_START_TIMEOUT_S + 20.0
#: Once the operations stop, the cluster matches the catalog within this.
CONVERGE_BOUND_S = 90.0
CHECK_INTERVAL_S = 0.5
#: Error statuses the gateway documents (docs/architecture.md, "Gateway rules": statuses used;
#: 429 passes through from engines), with OpenAI's shape; auth is off, so no 401/403.
DOCUMENTED_ERRORS = {400, 404, 408, 429, 502, 503, 504}
WANTED = {"placing", "downloading", "starting", "ready"}
ACTIVE = WANTED | {"draining", "stopping", "lost"}


@dataclass
class Answer:
    """One client request as the soak saw it (monotonic times; ``status`` None: no HTTP
    answer; ``replica``: its X-Llmgw-Replica; ``fingerprint``: the answering process)."""

    sent: float
    done: float
    model: str
    status: int | None
    replica: str = ""
    fingerprint: str = ""
    problem: str = ""
    disconnected: bool = False
    #: The connection failed (refused, reset, cut mid-body), whatever status came first.
    transport_error: bool = False


class InvariantChecks:
    """The checks of a soak; the Soak provides ``cluster``, ``log_dir``, ``lock``, ``t0``,
    ``result``, ``answers``, ``web_down``, ``worker_down``, ``keys``, ``pid_keys``, ``crashed_at``, ``unwanted_since``,
    ``ready_wrong_since``, ``config``, ``stop_all``, ``violate()`` and ``op()``."""

    @staticmethod
    def _body_check(status: int, raw: bytes, stream: bool) -> tuple[str, str]:
        """(system_fingerprint of a 200, a problem with the answer's shape or "")."""
        if status == 200:
            if stream:
                for line in raw.splitlines():
                    if line.startswith(b"data: {"):
                        return json.loads(line[6:]).get("system_fingerprint") or "", ""
                try:  # not a stream: whoever answered may still say who it is
                    fingerprint = json.loads(raw).get("system_fingerprint") or ""
                except (ValueError, AttributeError):
                    fingerprint = ""
                return fingerprint, "a 200 stream with no data event"
            try:
                data = json.loads(raw)
            except ValueError:
                return "", f"a 200 that is not JSON: {raw[:120]!r}"
            return data.get("system_fingerprint") or "", "" if data.get("choices") else f"a 200 without choices: {raw[:160]!r}"
        try:
            error = json.loads(raw).get("error")
        except (ValueError, AttributeError):
            error = None
        if not isinstance(error, dict) or not error.get("message") or not error.get("type"):
            return "", f"HTTP {status} without OpenAI's error shape: {raw[:160]!r}"
        return "", ""

    def check_answers(self, final: bool = False) -> None:
        with self.lock:
            answers, self.answers = self.answers, []
            windows = [tuple(w) for w in self.web_down]
        for a in answers:
            took = a.done - a.sent
            where = f"{a.sent - self.t0:.2f}s POST {a.model}"
            if a.transport_error:
                if any(down - 1.0 <= a.done and a.sent <= up for down, up in windows):
                    with self.lock:
                        self.result.excused += 1
                    continue
                got = "no HTTP answer" if a.status is None else f"HTTP {a.status} then a broken connection"
                self.violate("answered", f"{where}: {got} after {took:.1f} s ({a.problem}) with every web process up")
                continue
            if took > REQUEST_BOUND_S + 1.0:
                self.violate("answered", f"{where}: HTTP {a.status} after {took:.1f} s (bound {REQUEST_BOUND_S:.0f} s)")
            if a.status == 200 and not a.disconnected and a.fingerprint and not a.fingerprint.startswith("fake-engine-pid-"):
                self.check_routing(a, where)  # an impostor's answer: its shape is not the point
                continue
            if a.status != 200 and a.status not in DOCUMENTED_ERRORS:
                self.violate("answered", f"{where}: HTTP {a.status}, not a documented status ({a.problem or 'body ok'})")
            elif a.problem:
                self.violate("answered", f"{where}: {a.problem}")
            if a.status == 200 and not a.disconnected and not a.problem:
                self.check_routing(a, where)

    def check_routing(self, a: Answer, where: str) -> None:
        """A 200's replica (X-Llmgw-Replica) against the process that answered it; each
        (replica, process) pair is reported once."""
        rid_text = a.replica.partition("@")[0]
        once = (a.replica, a.fingerprint)
        if not a.fingerprint.startswith("fake-engine-pid-"):
            if self._sent_just_after_its_engine_died(a):
                return
            self.violate("routing", f"{where}: answered 200 by replica {a.replica or '(no X-Llmgw-Replica)'} "
                                    f"from a process that is not a soak engine (system_fingerprint {a.fingerprint!r})", once=once)
            return
        pid = int(a.fingerprint.rsplit("-", 1)[1])
        key = self.pid_keys.get(pid)
        if key is None:
            argv = cmdline(pid)
            key = argv[argv.index("--api-key") + 1] if "--api-key" in argv[:-1] else None
        if not rid_text.isdigit():
            self.violate("routing", f"{where}: a 200 with no replica named (X-Llmgw-Replica {a.replica!r}), from pid {pid}",
                         once=once)
            return
        want = self.keys.get(int(rid_text)) or self._key_of(int(rid_text))
        if key is None or want is None:
            return  # the process and the row are both gone, unseen: nothing to compare
        if key != want:
            owner = next((rid for rid, k in dict(self.keys).items() if k == key), None)
            self.violate("routing", f"{where}: X-Llmgw-Replica {a.replica} but the answer came from pid {pid}, the engine "
                                    f"of {'replica ' + str(owner) if owner else 'no known replica'}", once=once)

    def _sent_just_after_its_engine_died(self, a: Answer) -> bool:
        """``a`` was sent to a replica whose engine the soak killed at most CRASH_WINDOW_S
        before (the window an impostor on its port is excused)."""
        rid_text = a.replica.partition("@")[0]
        key = self.keys.get(int(rid_text)) if rid_text.isdigit() else None
        died = self.crashed_at.get(key) if key else None
        return died is not None and 0 <= a.sent - died <= CRASH_WINDOW_S

    def _key_of(self, replica_id: int) -> str | None:
        from fleet.models import Replica

        key = Replica.objects.filter(pk=replica_id).values_list("engine_key", flat=True).first()
        if key:
            self.keys[replica_id] = key
        return key

    # -- invariants ------------------------------------------------------------------------
    def check_loop(self) -> None:
        while not self.stop_all.is_set():
            self.check_once()
            self.stop_all.wait(CHECK_INTERVAL_S)

    def rows(self, engines: list[EngineProcess]) -> dict[str, dict]:
        """Engine key → its replica row (id, state, agent, port, pid, model, gpus), for rows
        that are active and rows the running engines name."""
        from django.db.models import Q

        from fleet.models import Replica

        fields = ("id", "engine_key", "state", "agent__name", "port", "pid", "model__name", "gpu_indices",
                  "state_changed_at")
        query = Q(state__in=ACTIVE) | Q(engine_key__in=[e.key for e in engines if e.key])
        out = {}
        for row in Replica.objects.filter(query).values(*fields):
            out[row["engine_key"]] = row
            self.keys[row["id"]] = row["engine_key"]
        return out

    def check_once(self) -> None:
        engines = engine_processes(self.log_dir, self.cluster.agent_dirs())
        rows = self.rows(engines)
        now = time.monotonic()
        with self.lock:
            self.result.checks += 1
        self.pid_keys.update({e.pid: e.key for e in engines})
        self.check_gpu_memory(engines, rows)
        self.check_wanted(engines, rows, now)
        self.check_ready_identity(engines, rows, now)

    def check_gpu_memory(self, engines: list[EngineProcess], rows: dict[str, dict]) -> None:
        for agent, sizes in GPU_MIB.items():
            mine = [e for e in engines if e.agent == agent]
            if not sizes:
                for e in mine:
                    if e.gpus:
                        self.violate("gpu-memory", f"engine {e.describe()} on the CPU-only agent {agent} names GPUs",
                                     once=("cpu-gpu", e.pid))
                continue
            for index, total in enumerate(sizes):
                on = [e for e in mine if index in e.gpus]
                used = sum(e.gpu_memory_mib for e in on)
                if used > total:
                    who = "; ".join(f"{e.describe()} = {self._who(e, rows)}" for e in on)
                    self.violate("gpu-memory", f"agent {agent} GPU {index} ({total} MiB) has {used} MiB of engines "
                                               f"running: {who}", once=("gpu", agent, index, frozenset(e.pid for e in on)))
            for e in mine:
                if any(i >= len(sizes) for i in e.gpus):
                    self.violate("gpu-memory", f"engine {e.describe()} names a GPU agent {agent} does not have",
                                 once=("no-gpu", e.pid))

    def _who(self, e: EngineProcess, rows: dict[str, dict]) -> str:
        row = rows.get(e.key)
        if row is None:
            return "no replica row (deleted)"
        return f"r{row['id']} of {row['model__name'] or '(a deleted model)'} on {row['agent__name']}, {row['state']}"

    def _web_back_at(self, now: float) -> float | None:
        """None while a web process is down (an agent may not hear what it must stop), else
        when the last one came back (-inf if none went down)."""
        return self._back_at(self.web_down, now)

    def _planner_back_at(self, now: float) -> float | None:
        """None while a worker is down or its successor cannot lead yet (``worker_down``'s
        windows end there: no pass drains, stops or settles a lost replica meanwhile), else
        when the last one could lead again (-inf if none went down)."""
        return self._back_at(self.worker_down, now)

    def _back_at(self, down: list[list[float]], now: float) -> float | None:
        with self.lock:
            windows = [tuple(w) for w in down]
        if any(start <= now <= end for start, end in windows):
            return None
        return max((end for _, end in windows if end <= now), default=float("-inf"))

    def _reconnected_at(self, now: float) -> dict[str, float]:
        """Agent name → when (monotonic) its current websocket connected, from its row's
        ``connected_since``; an agent not connected is absent. After a web process's return an
        agent is heard only once it has reconnected (its backoff may have grown to seconds)."""
        from fleet.models import Agent

        wall_now = time.time()
        return {name: now - (wall_now - since.timestamp())
                for name, connected, since in Agent.objects.values_list("name", "connected", "connected_since")
                if connected and since is not None}

    def _told_since(self, agent: str, web_back: float, reconnected: dict[str, float]) -> float | None:
        """Since when ``agent`` could be told and heard (after the last web return, once it
        reconnected); None while it cannot."""
        if web_back == float("-inf"):
            return web_back
        at = reconnected.get(agent)
        if at is None or at < web_back - 1.5:  # its row's flag is from before the return
            return None
        return max(at, web_back)

    def check_wanted(self, engines: list[EngineProcess], rows: dict[str, dict], now: float) -> None:
        web_back = self._web_back_at(now)
        planner_back = self._planner_back_at(now)
        reconnected = self._reconnected_at(now) if web_back not in (None, float("-inf")) else {}
        seen = set()
        by_key: dict[str, list[EngineProcess]] = {}
        for e in engines:
            by_key.setdefault(e.key, []).append(e)
        for e in engines:
            ident = (e.pid, e.start_ticks)
            seen.add(ident)
            row = rows.get(e.key)
            why = ""
            if row is None:
                why = "its key is no replica row's (the row was deleted)"
            elif row["state"] not in WANTED:
                why = f"its replica r{row['id']} of {row['model__name'] or '(a deleted model)'} is {row['state']}"
            elif row["agent__name"] != e.agent:
                why = f"its replica r{row['id']} is placed on {row['agent__name']}, not {e.agent}"
            elif len(by_key[e.key]) > 1 and row["pid"] != e.pid:
                why = f"a second engine for r{row['id']} (the row names pid {row['pid']})"
            if not why:
                self.unwanted_since.pop(ident, None)
                continue
            first = self.unwanted_since.setdefault(ident, now)
            up = self.cluster.up_since.get(e.agent)
            told = None if web_back is None else self._told_since(e.agent, web_back, reconnected)
            if up is None or told is None or planner_back is None:
                continue  # its agent, its way to a web process, or the planner is down: nobody can stop it yet
            since = max(first, up, told, planner_back)
            if now - since > ORPHAN_GRACE_S:
                self.violate("unwanted-engine", f"engine {e.describe()} still runs {now - since:.1f} s after it became "
                                                f"unwanted while agent {e.agent} ran (grace {ORPHAN_GRACE_S:.0f} s): {why}",
                             once=("unwanted", ident))
        for ident in [i for i in self.unwanted_since if i not in seen]:
            del self.unwanted_since[ident]

    def check_ready_identity(self, engines: list[EngineProcess], rows: dict[str, dict], now: float) -> None:
        ready = [r for r in rows.values() if r["state"] == "ready" and r["port"]]
        by_key = {e.key: e for e in engines}
        owners = listeners({r["port"] for r in ready}, [e.pid for e in engines] + [os.getpid()])
        # A web process down: an agent's report may have had no way in (nor did any request
        # to route); the grace starts again once it is back.
        web_back = self._web_back_at(now)
        reconnected = self._reconnected_at(now) if web_back not in (None, float("-inf")) else {}
        for row in ready:
            mine = by_key.get(row["engine_key"])
            if (web_back is None or self._told_since(row["agent__name"], web_back, reconnected) is None
                    or self.cluster.up_since.get(row["agent__name"]) is None):
                self.ready_wrong_since.pop(row["id"], None)
                continue  # an agent down cannot report; the lost grace covers it
            holder = owners.get(row["port"])
            if mine is not None and holder == mine.pid:
                self.ready_wrong_since.pop(row["id"], None)
                continue
            first = self.ready_wrong_since.setdefault(row["id"], now)
            if now - first <= READY_GRACE_S:
                continue
            if row["port"] not in owners:
                shown = "nothing listens there"
            elif holder == os.getpid():
                shown = "the soak's impostor holds it"
            elif holder is None:
                shown = "a process outside the soak holds it"
            else:
                other = next((e for e in engines if e.pid == holder), None)
                shown = f"it is held by {other.describe() if other else holder} = {self._who(other, rows) if other else '?'}"
            engine = f"its engine is {mine.describe()}" if mine else "no engine with its key runs"
            self.violate("ready-identity", f"r{row['id']} of {row['model__name']} on {row['agent__name']} is ready on port "
                                           f"{row['port']} for {now - first:.1f} s, but {shown}; {engine}",
                         once=("ready", row["id"], row["port"]))

    # -- convergence -----------------------------------------------------------------------
    def converge(self) -> float | None:
        """Seconds until the cluster matched the catalog twice in a row; None (and a
        violation listing what differed) after ``converge_bound_s``."""
        start = time.monotonic()
        stable, problems = 0, []
        while time.monotonic() - start < self.config.converge_bound_s:
            problems = self.differences()
            stable = stable + 1 if not problems else 0
            if stable >= 2:
                took = time.monotonic() - start
                self.op(f"converged in {took:.1f} s")
                return took
            time.sleep(CHECK_INTERVAL_S)
        self.violate("convergence", f"not converged {self.config.converge_bound_s:.0f} s after the operations stopped: "
                     + "; ".join(problems))
        return None

    def differences(self) -> list[str]:
        """What differs between the catalog's desired set and what runs ([] = converged)."""
        from catalog.models import ClusterSettings
        from fleet.models import ModelState, Replica

        problems = []
        if ClusterSettings.get_solo().stopped:
            problems.append("the cluster is stopped")
        engines = {e.key: e for e in engine_processes(self.log_dir, self.cluster.agent_dirs())}
        try:
            # lazy: the spec hash exists only once edits roll (issue 14); without it, skipped
            from fleet.control.specs import is_outdated, spec_hash
        except ImportError:
            is_outdated = spec_hash = None
        has_hash = spec_hash is not None and any(f.name == "spec_hash" for f in Replica._meta.get_fields())
        claimed = set()
        for model in self._models():
            desired = ModelState.objects.filter(model=model).values_list("desired", flat=True).first()
            rows = list(Replica.objects.filter(model=model, state__in=ACTIVE).values())
            ready = [r for r in rows if r["state"] == "ready"]
            moving = [f"r{r['id']} {r['state']}" for r in rows if r["state"] != "ready"]
            if desired is None or not model.min_replicas <= desired <= model.max_replicas:
                problems.append(f"{model.name}: desired {desired}, outside min {model.min_replicas} .. max {model.max_replicas}")
            elif len(ready) != desired:
                problems.append(f"{model.name}: {len(ready)} ready of {desired} desired")
            if moving:
                problems.append(f"{model.name}: {', '.join(moving)}")
            if has_hash:
                current = spec_hash(model, model.profile)
                stale = [f"r{r['id']}" for r in ready if is_outdated(r.get("spec_hash") or "", current)]
                if stale:
                    problems.append(f"{model.name}: {', '.join(stale)} ready with an outdated spec hash")
            for r in ready:
                claimed.add(r["engine_key"])
                problems += self.spec_differences(model, r, engines.get(r["engine_key"]))
        for key, e in engines.items():
            if key not in claimed:
                problems.append(f"extra engine {e.describe()}")
        return problems

    @staticmethod
    def spec_differences(model, row: dict, e: EngineProcess | None) -> list[str]:
        """How the engine of ready ``row`` differs from what ``model``'s profile says now."""
        name = f"{model.name} r{row['id']}"
        if e is None:
            return [f"{name} is ready but no engine with its key runs"]
        if e.pid != row["pid"] or not alive(e.pid):
            return [f"{name}: the row names pid {row['pid']}, its engine is {e.describe()}"]
        profile = model.profile
        out = []
        tokens = profile.command.split("--tokens ")[1].split()[0] if "--tokens " in profile.command else None
        if e.served_name != model.name:
            out.append(f"{name} serves {e.served_name!r}, not {model.name!r}")
        if tokens is not None and e.arg("--tokens") != tokens:
            out.append(f"{name} runs with --tokens {e.arg('--tokens')}, its profile {profile.name} says --tokens {tokens} (outdated)")
        if len(e.gpus) != profile.gpus_needed or e.gpu_memory_mib != profile.gpu_memory_mib:
            out.append(f"{name} runs on {len(e.gpus)} GPU x {e.gpu_memory_mib} MiB, its profile {profile.name} says "
                       f"{profile.gpus_needed} x {profile.gpu_memory_mib} MiB (outdated)")
        return out
