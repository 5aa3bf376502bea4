"""The engines the router routes to: the registry, discovery, health, admission, outlier ejection,
loads, the upstream connection pools, the networks they may be on."""
