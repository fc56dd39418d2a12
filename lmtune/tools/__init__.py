"""Measuring the machine: the training step's throughput, the environment check, a sweep's progress."""
