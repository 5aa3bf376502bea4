"""The pod runner: every pod the local cluster binds runs as real processes on loopback.

See `runner.py` (the process), `pod.py` and `container.py` (a pod's and a container's
lifecycle), `container_spec.py` (argv, environment, volumes as paths), `images.py` (images as
local commands), `probes.py`, `status.py`, `services.py` (Services at loopback addresses) and
`addresses.py`. docs/development.md, "Pods that run", is the guide.
"""
