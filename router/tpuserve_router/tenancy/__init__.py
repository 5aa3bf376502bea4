"""Who may send what: API keys, per-key quotas, the hold queues, the demand Lease."""
