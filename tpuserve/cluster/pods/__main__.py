"""`python -m tpuserve.cluster.pods`: the pod runner process (started by `Cluster`)."""

from tpuserve.cluster.pods.runner import main

raise SystemExit(main())
