"""From the command to cells: the config schema, the grid, and what each cell needs (fit)."""
