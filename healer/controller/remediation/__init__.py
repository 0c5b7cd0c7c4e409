"""Carrying out actions: the action runner (gates, actuators, confirmation), the safety policy (circuit
breaker, exclusions), and the recovery ladders that reset, reboot and return a node to service.
"""
