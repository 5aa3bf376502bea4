"""`python -m tpuserve.cluster.monitoring`: the local cluster's Prometheus."""

from tpuserve.cluster.monitoring.controller import main

raise SystemExit(main())
