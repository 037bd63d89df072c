"""Status bar: the <agent_status> message computed by code from the trajectory."""
