"""Training one model: its config, the model, the state and the step, the loop, checkpoints and metrics."""
