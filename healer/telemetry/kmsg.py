"""Kernel-log records and the NVIDIA lines in them, parsed: pure functions, no I/O.

``/dev/kmsg`` hands out one record per read, ``priority,sequence,timestamp_us,flags[,...];message``
followed by optional continuation lines that start with a space (``SUBSYSTEM=pci``); a plain dmesg or
syslog line (``[ 123.456] NVRM: ...``) is accepted too, with no sequence number. NVIDIA's GPU driver
writes ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`` (older
drivers leave out ``PCI:``, and ``pid``/``name`` may be ``'<unknown>'``), and its NVSwitch driver
writes ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ...``. Some codes carry
register words that decide what to do: XID 74 (``... link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0,
0x0)``), decoded per NVIDIA's Hopper table, and the NVLink5 XIDs 144-150 (``145, RLW, nonfatal, ...,
Link 3 (0x00000004 0x00000001 ...)``), whose unit, fatality, link and words are extracted.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final, Literal

from healer.schemas import events

_KMSG: Final = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<ts>\d+),[^;]*;(?P<msg>.*)$")
_DMESG_TS: Final = re.compile(r"^\[\s*\d+\.\d+\]\s*")
_PCI: Final = (
    r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?"
)
_XID: Final = re.compile(r"NVRM: Xid \((?:PCI:)?" + _PCI + r"\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?$")
_SXID: Final = re.compile(
    r"(?P<switch>nvidia-nvswitch\d*): SXid \((?:PCI:)?" + _PCI + r"\): (?P<code>\d+)(?:,\s*(?P<rest>.*))?$"
)
_PID: Final = re.compile(r"^pid=(?P<pid>[^,]*),\s*")
_NAME: Final = re.compile(r"^name=(?P<name>[^,]*),?\s*")
_XID74: Final = re.compile(r"link\s+(?P<link>\d+)\s*\((?P<regs>0x[0-9a-fA-F]+(?:\s*,\s*0x[0-9a-fA-F]+)*)\)")
_NVLINK5: Final = re.compile(r"^(?P<unit>[A-Z][A-Z0-9_]*),\s*(?P<fatal>nonfatal|fatal)\b", re.IGNORECASE)
_LINK: Final = re.compile(r"\blink\s+(?P<link>\d+)", re.IGNORECASE)
_WORDS: Final = re.compile(r"\((?P<words>\s*0x[0-9a-fA-F]+(?:[\s,]+0x[0-9a-fA-F]+)*\s*)\)\s*$")
_MARK: Final = re.compile(r"NVRM: Xid\b|\bSXid\b")
NVLINK5_XIDS: Final = frozenset(range(144, 151))


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One kernel-log record: ``seq`` and ``priority`` are None for a plain (non-kmsg) line."""

    message: str
    seq: int | None = None
    priority: int | None = None
    ts_us: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PciAddress:
    domain: int
    bus: int
    device: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}"

    @classmethod
    def parse(cls, text: str) -> PciAddress | None:
        """``0000:3b:00``, ``0000:3b:00.0`` or NVML's ``00000000:3B:00.0``."""
        m = re.fullmatch(_PCI, text.strip())
        if m is None:
            return None
        return cls(int(m["domain"], 16), int(m["bus"], 16), int(m["dev"], 16))


@dataclasses.dataclass(frozen=True, slots=True)
class NvidiaLine:
    """An XID (GPU) or SXID (NVSwitch) line: the fields healer's NodeEvent carries."""

    kind: Literal["xid", "sxid"]
    pci: PciAddress
    code: int
    text: str
    """What the driver said after the code (pid and name removed)."""
    pid: int | None = None
    process: str | None = None
    details: dict[str, events.DetailValue] = dataclasses.field(default_factory=dict)


def parse_record(line: str) -> Record | None:
    """A kmsg record or a plain log line; None for a continuation line (`` KEY=value``) or nothing."""
    if not line.strip() or line[0] in " \t":
        return None
    m = _KMSG.match(line)
    if m is not None:
        return Record(m["msg"], int(m["seq"]), int(m["pri"]), int(m["ts"]))
    return Record(_DMESG_TS.sub("", line, count=1))


def parse_nvidia(message: str) -> NvidiaLine | None:
    """The XID or SXID in a log message, or None when it is neither."""
    m = _XID.search(message)
    if m is not None:
        pci = PciAddress(int(m["domain"], 16), int(m["bus"], 16), int(m["dev"], 16))
        code = int(m["code"])
        rest, pid, process = _pid_and_name(m["rest"] or "")
        return NvidiaLine("xid", pci, code, rest, pid, process, decode(code, rest))
    m = _SXID.search(message)
    if m is not None:
        pci = PciAddress(int(m["domain"], 16), int(m["bus"], 16), int(m["dev"], 16))
        rest = (m["rest"] or "").strip()
        details: dict[str, events.DetailValue] = {"switch": m["switch"]}
        severity, _, after = rest.partition(",")
        if severity.strip().lower() in ("fatal", "non-fatal"):
            details["fatal"] = severity.strip().lower() == "fatal"
            rest = after.strip()
        if (link := _LINK.search(rest)) is not None:
            details["link"] = int(link["link"])
        return NvidiaLine("sxid", pci, int(m["code"]), rest, details=details)
    return None


def names_nvidia(message: str) -> bool:
    """Whether a message says it is an XID or SXID line: one of these that ``parse_nvidia`` cannot
    read is a format healer does not know (counted, so a driver's new wording does not go unseen)."""
    return _MARK.search(message) is not None


def _pid_and_name(rest: str) -> tuple[str, int | None, str | None]:
    pid: int | None = None
    process: str | None = None
    if (m := _PID.match(rest)) is not None:
        raw = m["pid"].strip("'\"")
        pid = int(raw) if raw.isdigit() else None
        rest = rest[m.end() :]
        if (n := _NAME.match(rest)) is not None:
            name = n["name"].strip()
            process = None if name in ("<unknown>", "") else name
            rest = rest[n.end() :]
    return rest.strip(), pid, process


def decode(code: int, text: str) -> dict[str, events.DetailValue]:
    """What NVIDIA's catalog lets healer read from the register words of XID 74 and 144-150."""
    if code == 74:
        return _decode_xid74(text)
    if code in NVLINK5_XIDS:
        return _decode_nvlink5(text)
    return {}


# XID 74 on Hopper: bits of register words 0, 2, 3 and 4 (0-based) and what NVIDIA's catalog makes
# of them. "link_hardware": check the link's connections and contact support; "ecc_parity": likely a
# hardware ECC/parity fault (support if it repeats on the link); "ecc_threshold": ECC errors passed a
# threshold with nothing uncorrectable, keep running; "link_other": support if it repeats or is alone.
_XID74_BITS: Final[tuple[tuple[str, int, frozenset[int]], ...]] = (
    ("link_hardware", 0, frozenset({8, 9, 12, 16, 17, 24, 28})),
    ("link_hardware", 2, frozenset({13})),
    ("ecc_parity", 0, frozenset({4, 5})),
    ("ecc_parity", 2, frozenset({0, 1, 2, 6})),
    ("ecc_parity", 4, frozenset({18, 19, 21, 22, 24, 25, 27, 28})),
    ("link_other", 0, frozenset({1, 20, 21, 22, 27, 29})),
    ("link_other", 2, frozenset({16, 17, 18, 19})),
    ("link_other", 3, frozenset({16, 17, 18})),
    ("ecc_threshold", 4, frozenset({20, 23, 26, 29})),
)


def _decode_xid74(text: str) -> dict[str, events.DetailValue]:
    m = _XID74.search(text)
    if m is None:
        return {}
    words = [int(w, 16) for w in re.split(r"\s*,\s*", m["regs"])]
    out: dict[str, events.DetailValue] = {"link": int(m["link"])}
    out.update({f"reg{i}": w for i, w in enumerate(words)})
    verdict = "unknown"
    if len(words) == 7:
        for name, reg, bits in _XID74_BITS:
            if any(words[reg] >> b & 1 for b in bits):
                verdict = name
                break
    out["nvlink_class"] = verdict
    return out


def _decode_nvlink5(text: str) -> dict[str, events.DetailValue]:
    out: dict[str, events.DetailValue] = {}
    if (m := _NVLINK5.match(text)) is not None:
        out["unit"] = m["unit"].upper()
        out["fatal"] = m["fatal"].lower() == "fatal"
    if (link := _LINK.search(text)) is not None:
        out["link"] = int(link["link"])
    if (w := _WORDS.search(text)) is not None:
        words = [int(x, 16) for x in re.split(r"[\s,]+", w["words"].strip())]
        out.update({f"reg{i}": v for i, v in enumerate(words)})
    return out
