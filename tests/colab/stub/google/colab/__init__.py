"""A stand-in for Colab's ``google.colab`` module (Colab-like test only).

Colab's kernel imports ``google.colab`` when it starts; the notebooks' install cells test
``"google.colab" in sys.modules`` to know they run in Colab. The test imports this stub from an
IPython startup file, so the kernel looks like Colab's to the notebooks.
"""
import types

STUB = True

output = types.ModuleType("google.colab.output")
output.enable_custom_widget_manager = lambda: None      # what Colab offers for third-party widgets
output.disable_custom_widget_manager = lambda: None
