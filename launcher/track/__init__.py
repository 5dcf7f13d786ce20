"""The MLflow side: the store, the runs kept in agreement with the cells, each cell's state."""
