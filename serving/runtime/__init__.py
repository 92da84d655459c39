"""Models resident in a process: the repository (load, probe, warm, swap), the adaptive batcher,
classification around the model, and memory handed back after a swap."""
