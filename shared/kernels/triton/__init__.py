"""Triton kernels, one file per kernel, each with a typed wrapper and its torch reference beside it.

Every kernel runs compiled on CUDA tensors and under Triton's interpreter on CPU tensors (launch.py), chosen by the
device of the tensors it is given; nothing here reads global state or environment variables to decide.
"""
