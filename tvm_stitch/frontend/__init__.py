"""Model import front ends."""
