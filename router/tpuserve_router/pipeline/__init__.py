"""The one request pipeline every front runs (admit, select, relay, account) and what its stages
read: request bodies, ids, limits, usage, retries, deadlines, the ledger."""
