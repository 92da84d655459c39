"""The sync protocol both sides import: authentication, signed directives, audit witness
statements, chunk checks, rates and backoff. Nothing here loads the serving runtime."""
