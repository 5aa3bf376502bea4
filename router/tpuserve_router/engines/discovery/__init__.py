"""Where the router learns its workers: a static list or a Kubernetes pod watch."""
