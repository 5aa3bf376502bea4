"""Router replicas sharing what they route: the peer link and view, its keys, and KV snapshots
over it."""
