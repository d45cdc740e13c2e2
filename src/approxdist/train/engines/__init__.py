"""The trainer's engines, one module per parallel mode; the mode records (`train/modes/`)
name them."""
