"""The edge-of-stability report: reading a sweep, the stability numbers, sharpness, figures and the text."""
