"""The Kubernetes side: kopf handlers, the tuning daemon, the actuator, reconcile, children,
rollouts, the API client and status writes."""
