"""lm-eval-toolfid: did a LoRA adapter keep the base model's tool-calling behaviour?"""

__version__ = "0.1.0"
