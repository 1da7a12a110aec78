"""Test stub of the ``google`` namespace (Colab-like test only; never installed by the package)."""
__path__ = __import__("pkgutil").extend_path(__path__, __name__)
