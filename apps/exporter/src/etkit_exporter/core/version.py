"""The app's version (its distribution's, ``etkit-exporter``)."""

__version__ = "0.1.0"
