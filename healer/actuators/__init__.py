"""Actuators: where healer's decisions touch the world (node agents, Slurm, Kubernetes).

Import the submodules (``from healer.actuators import base, slurm``). ``base`` holds the contract every
actuator keeps; only ``kubernetes`` imports the ``kubernetes`` client.
"""
