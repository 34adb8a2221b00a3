"""Utilities with PyTorch's ``torch.utils`` names: :mod:`flowgraph.utils.data` (datasets, samplers, ``DataLoader``).

Nothing is imported here eagerly: ``import flowgraph.utils.data`` loads the data tools on first use.
"""
