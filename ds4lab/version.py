"""ds4lab's version, for what a result records (``meta.json``), below every layer that records it."""

__version__ = "0.1.0"
