"""Kernel templates: whole CUDA kernels written in TIR for an operation recognized by meaning
(attention, softmax·V, top-k rows, row norms), each with its finder, configuration and the
kernel it writes. The schedule rules that transform a user's function with s_tir primitives
live in :mod:`tvm_dsm.rules`."""
