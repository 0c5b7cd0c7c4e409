"""Fail-slow detection (#28): the GPU and node scorer against their job's peers (``stragglers``, with what
clock reasons say in ``clock_reasons`` and the group statistics in ``peer_stats``), slow ports
(``straggler_ports``), step times from the job (``steptimes``), the three together as the controller runs
them (``detector``), and job slowdowns as incidents (``job_slowdowns``).
"""
