"""``healer demo``: the whole story on one machine, nothing installed by hand.

An embedded nats-server, the real controller with the default rule pack, and a simulated fleet whose node
agents answer power commands (so a cap really cools a GPU), running a scripted scenario; a live terminal
view; a summary scored against the simulator's ground truth. ``stage`` prepares rules, scenario and
fleet, ``runner`` starts and stops everything, ``watch`` follows the feed, ``view`` draws it.
"""
