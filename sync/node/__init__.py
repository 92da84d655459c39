"""A node's side of sync: the subscriber stream, converging on the directive, downloads,
trust metadata, witnesses and quality reports."""
