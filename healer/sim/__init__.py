"""The fleet simulator: a stand-in GPU fleet with physics, workloads, faults and ground truth.

Modules, bottom to top: ``profiles`` (what each GPU model is), ``workloads`` (jobs that drive
utilisation), ``fleet`` (the vectorised physics engine over nodes x GPUs), ``faults`` (what can go
wrong, each with its ground-truth record), ``scenarios`` (YAML files naming faults and rates),
``frames`` (arrays → NodeFrame JSON bytes without building pydantic models), ``recording`` (columnar
files for fast generation and replay) and ``live`` (N simulated agents on a bus, answering commands).
See docs/simulator.md.
"""
