"""Running grid cells: result records and their W&B mirror."""
