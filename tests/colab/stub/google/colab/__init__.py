"""A stand-in for Colab's ``google.colab`` module (Colab-like test only).

Colab's kernel imports ``google.colab`` when it starts. The test imports this stub from an
IPython startup file, so the kernel looks like Colab's to the notebooks (their install cells
work the same with or without it; the test also runs one notebook without it, as a plain
Jupyter).
"""
import types

STUB = True

output = types.ModuleType("google.colab.output")
output.enable_custom_widget_manager = lambda: None      # what Colab offers for third-party widgets
output.disable_custom_widget_manager = lambda: None
