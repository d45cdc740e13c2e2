"""Optimiser rules shared by the modes that apply gradients late (pipeline streams, parameter servers)."""
