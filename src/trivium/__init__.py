"""Trivium: reinforcement fine-tuning of LLMs with an explorer, a trainer and a buffer.

Importing the package is cheap on purpose: submodules load torch and transformers when used.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
