"""Power budgets (#30), the pure part: the budget's step (caps and restores per GPU) and the energy meter per
domain and job. The shell that applies them is ``core.power_shell``.
"""
