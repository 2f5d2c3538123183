"""Experiments that reproduce the papers' results with structconv layers."""
