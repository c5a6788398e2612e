"""The package version, in a leaf: folder markers record it without importing the package."""

__version__ = "0.1.0"
