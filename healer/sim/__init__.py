"""The fleet simulator: a stand-in GPU fleet with physics, workloads, faults and ground truth.

Modules, bottom to top: ``profiles`` (what each GPU model is), ``workloads`` (jobs that drive
utilisation), ``fleet`` (the vectorised physics engine over nodes x GPUs), ``faults`` (what can go
wrong), ``repair`` (what a GPU reset or a reboot fixes, per fault kind) and ``injector`` (starting
faults on time or at random, writing their ground truth), ``truth``
(truth files and per-sample labels), ``frames`` (arrays → NodeFrame JSON bytes without building
pydantic models), ``engine`` (one stepped simulation), ``scenarios`` (YAML files naming faults and
rates), ``recording`` (columnar files for fast generation and replay); then the runners ``live`` (N
simulated agents on a bus, answering commands) and ``replay``. See docs/simulator.md.
"""
