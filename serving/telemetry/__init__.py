"""What a node tells about itself: JSON logs, trace context and spans, Prometheus metrics, quality
windows for the registry's reports."""
