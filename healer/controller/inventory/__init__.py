"""What the controller knows about the fleet: which nodes are admitted, the failure domains each sits in and
how many of a domain may be out at once, and which jobs run on which GPUs.
"""
