"""The test and benchmark harness: processes on loopback and the fixtures tests and benchmarks
share. Its own layer: tests and ``bench`` import it, no product package does."""
