"""A sweep as one Ray Tune experiment: search spaces, the plan, the trainable, stopping, the records, the runner."""
