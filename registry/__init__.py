"""The registry: SQLite catalog, content-addressed blob store, audit chain, publish pipeline."""
