"""``tiered report``: availability, latency and the edge's share of the rows over a window
(30 days by default), from Prometheus's own data, as markdown, JSON and a PNG plot."""
