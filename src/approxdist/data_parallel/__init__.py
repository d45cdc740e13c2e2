"""Data parallelism: gradient averaging across replicas."""
