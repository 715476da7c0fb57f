"""Kernels, one file per op: torch reference implementations (CPU), chosen through `dispatch`."""
