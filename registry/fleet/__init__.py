"""The fleet as the registry sees it: each node's identity, state and reports, and the
escalation budgets split over the edges."""
