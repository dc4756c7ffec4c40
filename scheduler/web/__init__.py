"""The HTTP faces of the daemon: the extender verbs and probes, the webhook, the pod API,
the wire shapes they speak and the limits they hold requests to."""
