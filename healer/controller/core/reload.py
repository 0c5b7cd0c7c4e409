"""Rules reload: the rule pack is read at construction and again whenever its files change.

``load`` builds the rule engine (a controller whose rules do not load is never made). The housekeeping
task asks ``Reloader.maybe_reload`` every ``reload_check_s``: a changed pack that loads replaces the
rules (firings of rules that are gone resolve, carried out by the leader); one that does not load is
rejected, counted, logged with every error, and, by the leader, published on ``rules_rejected``; the
rules loaded before stay.
"""

from __future__ import annotations

import contextlib
import datetime
import pathlib
import uuid
from typing import Any

from healer import config, errors
from healer.bus import base as bus_base
from healer.bus import subjects
from healer.controller.core import context, incident_shell
from healer.controller.observability import repairs
from healer.rules import engine, loader
from healer.schemas import codec, incidents

Signature = tuple[tuple[str, float, int], ...]


def signature(path: pathlib.Path) -> Signature:
    """What the rule files are now (path, mtime, size): a change means reload."""
    out = []
    for p in loader.expand([path]):
        with contextlib.suppress(OSError):
            st = p.stat()
            out.append((str(p), st.st_mtime, st.st_size))
    return tuple(out)


def load(cs: config.ControllerSettings) -> engine.Engine:
    """The rule engine over ``rules_dir``; PermanentError listing every problem when the rules do not load."""
    result = loader.load_paths([pathlib.Path(cs.rules_dir)])
    if result.ruleset is None:
        raise errors.PermanentError(
            "rules do not load; fix them first:\n" + "\n".join(str(d) for d in result.errors)
        )
    return engine.Engine(result.ruleset, gpus_per_node=cs.gpus_per_node, stale_after_s=cs.stale_after_s)


class Reloader:
    def __init__(
        self,
        ctx: context.Context,
        bus: bus_base.Bus,
        subjects: subjects.Subjects,
        *,
        sig: Signature,
        engine: engine.Engine,
        shell: incident_shell.IncidentShell,
    ) -> None:
        """``sig``: the files' signature taken before the engine's rules were read."""
        self.cs = ctx.cs
        self.bus = bus
        self.subjects = subjects
        self.rules_path = pathlib.Path(ctx.cs.rules_dir)
        self.sig = sig
        self.engine = engine
        self.role = ctx.role
        self.shell = shell
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.log = ctx.log

    async def maybe_reload(self) -> None:
        sig = signature(self.rules_path)
        if sig == self.sig:
            return
        self.sig = sig
        result = loader.load_paths([self.rules_path])
        if result.ruleset is None:
            self.metrics.rules_rejected.inc()
            problems = result.errors
            self.log.error(
                "rules.rejected", errors=[str(d) for d in problems], kept=len(self.engine.rules.rules)
            )
            if self.role.leader:
                await self._publish_rejection(problems)
            return
        gone = self.engine.set_rules(result.ruleset, now=self.clock())
        self.metrics.rules_loaded.set(len(result.ruleset.rules))
        repairs.start_at_zero(self.metrics, ((r.id, str(r.scope)) for r in result.ruleset.rules))
        self.log.info("rules.reloaded", rules=len(result.ruleset.rules), resolved=len(gone))
        if self.role.leader:
            for f in gone:
                await self.shell.handle(f, self.clock())

    async def _publish_rejection(self, problems: list[Any]) -> None:
        event = incidents.RulesRejectedEvent(
            id=f"rules-{uuid.uuid4().hex}",
            source=f"healer://{self.cs.cluster}/controller",
            time=datetime.datetime.fromtimestamp(self.clock(), tz=datetime.UTC),
            data=incidents.RulesRejectedData(
                rules_dir=str(self.rules_path),
                errors=[
                    incidents.RuleProblem(path=d.path, line=d.line, col=d.col, message=d.message)
                    for d in problems
                ],
                kept_rules=len(self.engine.rules.rules),
            ),
        )
        try:
            await self.bus.publish_durable(self.subjects.rules_rejected, codec.encode(event), msg_id=event.id)
        except errors.HealerError as e:
            self.log.warning("rules.rejection_not_published", error=str(e))
