"""The engines' KV caches as the router knows them: KV-event subscriptions (ZMTP), replays,
snapshots and the block index they fill."""
