"""mlflow_plugin: the MLflow sink, rule runs, pages, plots and servers."""
