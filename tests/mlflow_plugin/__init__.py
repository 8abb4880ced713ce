"""mltrace_mlflow: the MLflow sink, rule runs, pages, plots and servers."""
