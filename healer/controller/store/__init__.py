"""What survives a restart or a failover: JSON documents in the bus's KV with compare-and-set, the leader
(and shard) leases, and whether this controller leads.
"""
