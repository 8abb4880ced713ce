"""MLflow side of mltrace (the rules and MLflow issue fills this package)."""
