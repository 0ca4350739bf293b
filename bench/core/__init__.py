"""The bottom layer: errors, registries, device batches and augmentation, seeding, atomic file writes.

It imports nothing from datamodules, lightning_modules or the rest of bench (tests/core/test_layering.py).
"""
