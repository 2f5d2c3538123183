r"""The theory layer: the algebra of bases (Prop. 1 and 3) and the conv ↔ attention theorem."""

from .algebra import combine, compose, decompose
from .conv_attention import (
    ConvHeads,
    ConvolutionFit,
    attention_alpha_bound,
    attention_to_conv,
    conv_heads,
    conv_module_heads,
    conv_to_attention,
    nearest_convolution,
)

__all__ = [
    "ConvHeads",
    "ConvolutionFit",
    "attention_alpha_bound",
    "attention_to_conv",
    "combine",
    "compose",
    "conv_heads",
    "conv_module_heads",
    "conv_to_attention",
    "decompose",
    "nearest_convolution",
]
