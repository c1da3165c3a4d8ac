"""Choosing between stitch plans: candidates, cost models, measurement, the tuner and its
database."""
