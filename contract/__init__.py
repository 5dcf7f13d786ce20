"""The contract between the launcher and the worker: what a cell runs (spec), how it is written
(codec), its MLflow run (cell_run), the metrics it reports (metrics), the records it leaves
(records), the rendezvous port a job derives from its id (rendezvous). Standard library only
(mlflow imported where a run is opened), importable without torch; neither side's code lives here.
"""
