"""The fleet console: a read-only web page for the operator (``tiered console``)."""
