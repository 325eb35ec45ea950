"""Clarifier fine-tuning against restore scores: sampling, preference pairs, TRL trainers."""
