"""TensorBoard plugin for mltrace trials (the TensorBoard issue fills this package)."""
