"""crosshost controller: inventory, bundle, fan-out over SSH, analysis and reports."""

__version__ = "0.1.0"
