"""The registry's storage: the SQLite database and its migrations, the role that fences writes,
the content-addressed blobs and chunks, and the hash-chained audit log."""
