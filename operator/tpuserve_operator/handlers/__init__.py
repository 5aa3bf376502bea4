"""kopf handlers. Importing `tpuserve_operator.handlers.tpumodelserver` registers them."""
