"""The numerics of every recipe, independent of any kernel: bit-exact formats (``formats``), the
quantizers (``quant``), the recipes (``recipes``), each recipe's quantized operands
(``operands``), the tiled torch reference that defines forward and backward (``reference``),
float64 attention as ground truth (``exact``), Direct-P for MXFP4 and E4M3 P (``direct_p``,
``direct_p_e4m3``), and the optional Hadamard rotation of Q/K before quantization
(``rotation``). Contract: ``shared/spec/precision-contract.md``."""
