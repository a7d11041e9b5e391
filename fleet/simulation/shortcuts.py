"""The simulator's two shortcuts, and their check (``fleet.simulation.engine``'s module
docstring): models a pass provably leaves alone stay out of its snapshot, and a pass in
which nothing can move is skipped — decided by the planner's own rules
(``planner.warm_ahead``, ``base_replicas``, ``desired_replicas``, ``scaling.evaluate``), and,
with ``SimConfig.check_pruning``, proved pass by pass against the full planner. A mixin of
:class:`~fleet.simulation.engine.Simulator`: it reads the simulator's models and state."""

from __future__ import annotations

from datetime import datetime, timedelta

from fleet.planning import planner, warmth
from fleet.planning.scaling import TREND_STEP_S, ScalingState, evaluate, ramp_applies, ramp_hold_s
from fleet.simulation.runtime import FOREVER, SimModel




class Shortcuts:
    """What lets a day of a million requests run in seconds; exact by construction and
    checked (``check_pruning``)."""

    def _included(self, t: float) -> list[SimModel]:
        """The models this pass puts in the snapshot, in catalog order; demand kept alive
        by use first (``fleet.control.usage.keep_demand_alive``)."""
        out, cold = [], []
        for m in self.hot:
            if m.wanted_s is not None:
                for r in m.reps:
                    used = t if r.in_flight else r.last_used
                    if used is not None and used > m.wanted_s:
                        m.wanted_s, m.wanted_dt = used, None
            if self.controller is not None:
                floor = m.window_min if m.window_min is not None else m.spec.min_replicas
                left = self.controller.leave_out(m.spec, len(m.reps), m.wanted_s is not None, bool(m.held), floor)
            else:
                left = self._leave_out(m, t)
            (cold if left else out).append(m)
        for m in cold:
            self.hot.discard(m)
        out.sort(key=lambda m: m.index)
        return out

    def _leave_out(self, m: SimModel, t: float) -> bool:
        """True when ``plan()`` provably decides nothing for ``m`` (module docstring): no
        demand, nothing held, no prediction, default scaling memory, and either cold
        (nothing active, a floor of 0) or fixed-size with all its replicas (not on demand,
        max ≤ min) — floor and max as pre-warm makes them now (``planner.warm_ahead``)."""
        if (m.held or m.wanted_s is not None or m.extra or m.busy_since is not None or m.quiet_since is not None
                or m.crowded_since is not None or m.unservable or m.trend is not None or m.predicted is not None):
            return False
        if m.next_window is not None and self.policy.prewarm_windows:
            view = planner.warm_ahead(self._model_view(m), self.policy, self.at(t))
            low, ceiling = planner.min_replicas_now(view), planner.ceiling_now(view)
        else:
            low = m.window_min if m.window_min is not None else m.spec.min_replicas
            ceiling = m.window_max if m.window_max else m.spec.max_replicas
        if m.active == 0 and low == 0:
            return True
        if not m.spec.on_demand:
            return ceiling <= low and m.active == low
        return False

    def _quiet(self, included: list[SimModel], now: datetime) -> bool:
        """True when ``plan()`` would neither act nor change what is stored, by the
        planner's own rules (``base_replicas``, ``desired_replicas``, ``scaling.evaluate``,
        called as ``plan()`` calls them): nothing draining may stop, and for every model
        in the snapshot the scaling memory stays, no step is taken, demand is not over,
        and its active replicas are exactly the desired ones. Then the pass is skipped;
        ``check_pruning`` runs ``plan()`` anyway and asserts it did nothing."""
        policy = self.policy
        grace = policy.drain_grace_s
        for r in self.draining.values():
            if r.in_flight == 0 or (now - r.changed_dt).total_seconds() >= grace:
                return False
        for m in included:
            if m.unservable:
                return False
            view = planner.warm_ahead(self._model_view(m), policy, now)
            if m.quiet_view is view and m.quiet_counts == (m.coming_up, m.active) and now < m.quiet_until:
                continue  # nothing it depends on moved, and none of its timers is due
            base = planner.base_replicas(view, policy, now)
            if view.on_demand and view.wanted_at is not None and base == 0 and planner.min_replicas_now(view) == 0:
                return False
            state = ScalingState(m.extra, m.busy_since, m.quiet_since, m.observed, m.crowded_since, m.trend)
            scaled_base = 0 if planner.speculative(view, policy, now) else base  # as _scale_by_load
            step = evaluate(scaled_base, planner.ceiling_now(view), view.load, view.measured_per_replica,
                            m.coming_up > 0, state, now, policy.scaling, m.cold_start.estimate_s)
            if step.moved or step.state != state:
                return False
            if planner.desired_replicas(view, policy, now) != m.active:
                return False
            m.quiet_view, m.quiet_counts, m.quiet_until = view, (m.coming_up, m.active), self._next_timer(view, now)
        return True

    def _next_timer(self, view: planner.ModelView, now: datetime) -> datetime:
        """The next instant at which the planner's verdict on an unchanged ``view`` may
        change by the clock alone: its idle timeout running out, or its busy or quiet timer
        reaching scale-up-after or scale-down-after. Timers already run out stay so."""
        policy = self.policy
        due = []
        if view.on_demand and view.wanted_at is not None:
            due.append(view.wanted_at + timedelta(seconds=planner.idle_timeout_s(view, policy)))
        if view.busy_since is not None:
            due.append(view.busy_since + timedelta(seconds=policy.scaling.scale_up_after_s))
        if view.quiet_since is not None:
            due.append(view.quiet_since + timedelta(seconds=policy.scaling.scale_down_after_s))
        if view.crowded_since is not None:
            due.append(view.crowded_since + timedelta(seconds=policy.scaling.scale_up_after_s))
        if view.next_window is not None and policy.prewarm_windows:
            due.append(view.next_window.starts_at)
            due.append(view.next_window.starts_at - timedelta(seconds=warmth.lead_s(planner.cold_start_of(view, policy))))
        if view.predicted is not None:
            due += [view.predicted.warm_from, view.predicted.until]
        trend = view.trend
        if trend is not None and ramp_applies(planner.cold_start_of(view, policy).estimate_s, policy.scaling):
            due.append(trend.at + timedelta(seconds=TREND_STEP_S))
            if trend.rising_since is not None:
                due.append(trend.rising_since + timedelta(seconds=ramp_hold_s(policy.scaling)))
        return min((d for d in due if d > now), default=FOREVER)

    def _check(self, t: float, now: datetime, result: planner.Plan | None, included: list[SimModel]) -> None:
        """Plan on the full snapshot too and assert the shortcuts changed nothing: the same
        actions, the same outcome for every model in the pass, and no change at all for the
        models left out (or for any model, after a pass skipped as quiet)."""
        expected = planner.plan(self._snapshot(t, now, included, full=True), now)
        actions = [] if result is None else result.actions
        if expected.actions != actions:
            raise AssertionError(f"at {t:.3f} s the shortcut planned {actions}, the full pass {expected.actions}")
        for m in self.models:
            b = expected.models[m.id]
            if result is not None and m in included:
                a = result.models[m.id]
                if (a.desired, a.unservable, a.forget_demand, a.scaling, a.scaled) != (
                        b.desired, b.unservable, b.forget_demand, b.scaling, b.scaled):
                    raise AssertionError(f"at {t:.3f} s {m.spec.name}: shortcut {a} != full {b}")
            elif (b.scaled or b.forget_demand or b.unservable != m.unservable or b.desired != m.active
                  or b.scaling != ScalingState(m.extra, m.busy_since, m.quiet_since, m.observed, m.crowded_since,
                                               m.trend)):
                raise AssertionError(f"at {t:.3f} s the full pass changed {m.spec.name}, which the shortcut "
                                     f"left alone: {b}")
