"""The in-pod ColBERT trainer. Importing the package imports no torch; ``trainer.config`` never does."""

__version__ = "0.4.0"
