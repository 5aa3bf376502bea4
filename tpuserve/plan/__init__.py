"""`tpuserve plan`: capacity and cost planning on the fleet model (`tpuserve.plan.planner`)."""
