"""mltrace.pytorch: the PyTorch hook, single process and distributed, and its examples."""
