"""The horizon search (issue 23, in progress): the best LR across token horizons."""
