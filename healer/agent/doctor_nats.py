"""``healer doctor``'s NATS checks: the node's credentials, its publish rights, and its clock.

The probes are ``healer.bus.probe``'s (no message is stored, see there). The other node's subject is
``<own name>.doctor-probe-other`` escaped as a node name: no identity but the controller's may publish
there, so a refusal is the expected answer.
"""

from __future__ import annotations

import asyncio
import contextlib

from healer import config, errors
from healer.agent import doctor
from healer.bus import probe, subjects

CLOCK_WARN_S = 1.0
"""An offset beyond this is worth fixing (chrony); the controller counts beyond ``max_clock_skew_s``."""


def _bounded(bound: probe.ClockBound | None) -> doctor.Check:
    if bound is None:
        return doctor.Check(
            "nats.clock", doctor.Status.INFO,
            "clock not compared: no leader lease to read; pass --nats-monitor http://<server>:8222",
        )  # fmt: skip
    data = {"offset_low_s": bound.low_s, "offset_high_s": bound.high_s}
    span = f"between {bound.low_s:+.1f} s and {bound.high_s:+.1f} s (from the leader lease's server time)"
    if bound.high_s < -CLOCK_WARN_S or bound.low_s > CLOCK_WARN_S:
        return doctor.Check(
            "nats.clock", doctor.Status.WARN, f"this clock is off the server's: {span}",
            "run chrony or ntpd against the fleet's time source", data=data,
        )  # fmt: skip
    return doctor.Check(
        "nats.clock",
        doctor.Status.OK,
        f"offset {span}; --nats-monitor measures it to the millisecond",
        data=data,
    )


def other_node(node: str) -> str:
    return f"{node}-doctor-probe-other"


async def run(
    s: config.Settings, node: str, monitor_url: str | None, timeout_s: float = 3.0
) -> list[doctor.Check]:
    subj = subjects.Subjects(s.nats.prefix)
    out: list[doctor.Check] = []
    with_identity = bool(s.nats.nkey_seed_file or s.nats.creds_file)
    try:
        nc, denied = await asyncio.wait_for(
            probe.connect(s.nats.url, s.nats, f"doctor:{node}"), timeout_s * 2
        )
    except (errors.HealerError, TimeoutError) as e:
        fix = "check nats.url, nats.nkey_seed_file / creds_file (healer nats config) and TLS settings"
        out.append(doctor.Check("nats.connect", doctor.Status.FAIL, str(e) or "connect timed out", fix))
        return [*out, _clock(monitor_url, None)]
    bound: probe.ClockBound | None = None
    try:
        who = "with its identity" if with_identity else "WITHOUT credentials"
        out.append(doctor.Check("nats.connect", doctor.Status.OK, f"connected to {s.nats.url} {who}"))
        own = await probe.publish_allowed(nc, denied, subj.events(node), timeout_s)
        data = {"subject": own.subject, "detail": own.detail}
        if own.allowed:
            out.append(
                doctor.Check(
                    "nats.publish_own",
                    doctor.Status.OK,
                    f"may publish {own.subject}: {own.detail}",
                    data=data,
                )
            )
        else:
            out.append(
                doctor.Check(
                    "nats.publish_own",
                    doctor.Status.FAIL,
                    f"cannot publish {own.subject}: {own.detail}",
                    "the seed must be this node's (--node must match the name in healer nats config)",
                    data=data,
                )
            )
        other = await probe.publish_refused(nc, denied, subj.events(other_node(node)), timeout_s)
        data = {"subject": other.subject, "detail": other.detail}
        if not other.allowed:
            out.append(
                doctor.Check("nats.publish_other", doctor.Status.OK, f"refused on {other.subject}", data=data)
            )
        else:
            status = doctor.Status.FAIL if with_identity else doctor.Status.WARN
            out.append(
                doctor.Check(
                    "nats.publish_other",
                    status,
                    f"may publish as another node ({other.subject})",
                    "run NATS with the authorization from `healer nats config` (docs/security.md)",
                    data=data,
                )
            )
        if not monitor_url:
            lease = subj.lease_subject("leader.shard-0")
            bound = await probe.lease_clock(nc, subj.lease_read_api, lease, s.nats.lease_ttl_s, timeout_s)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return [*out, _clock(monitor_url, bound)]


def _clock(monitor_url: str | None, bound: probe.ClockBound | None) -> doctor.Check:
    if not monitor_url:
        return _bounded(bound)
    try:
        c = probe.server_clock(monitor_url)
    except errors.HealerError as e:
        return doctor.Check(
            "nats.clock", doctor.Status.WARN, f"server clock unreadable: {e}", "check --nats-monitor"
        )
    data = {"offset_s": c.offset_s, "error_s": c.error_s}
    if abs(c.offset_s) - c.error_s > CLOCK_WARN_S:
        return doctor.Check(
            "nats.clock",
            doctor.Status.WARN,
            f"this clock is {c.offset_s:+.3f} s off the server's (+-{c.error_s:.3f})",
            "run chrony or ntpd against the fleet's time source",
            data=data,
        )
    return doctor.Check(
        "nats.clock", doctor.Status.OK, f"offset {c.offset_s:+.3f} s (+-{c.error_s:.3f})", data=data
    )
