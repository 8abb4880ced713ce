"""TensorBoard plugin for mltrace trials: the "mltrace" tab (see tb_plugin/loader.py)."""
