"""Whole models for ``kernellab optimize`` built from real model libraries (see library.py)."""
