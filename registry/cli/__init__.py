"""The ``registry`` command and its tables."""
