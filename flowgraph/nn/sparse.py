"""sparse layers (being written)."""

__all__: list[str] = []
__functional__: list[str] = []
